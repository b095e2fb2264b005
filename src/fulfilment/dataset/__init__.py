"""The Online Retail data set: its reader, its lifecycle, and the commands that use it.

``online_retail`` reads the files' orders and cancellation invoices; ``retail_lifecycle``
maps the cancellations to orders and plans the end-of-day shipments; ``files`` turns their
errors into the commands' bad input. The commands of the data set are ``publish``
(``fulfilment publish``), ``reconcile`` (``fulfilment reconcile``) and ``stock_plan``
(``fulfilment stock plan``); the demo (``fulfilment.demo``) plays the data set too.

Only those commands load this package: the other operator tools (``fulfilment.tools``) and
the worker and relay never import it (the import contracts in ``pyproject.toml``).
"""
