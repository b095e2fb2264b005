"""The operator tools: what the ``fulfilment`` command's sub-commands do.

Dead letters (``dlq``), ``report`` and reconcile, ``demo``, stock, publish, and their helpers
(the Online Retail reader, the stock planner, the stock CSV reader). Built by
``fulfilment.cli``; the worker never imports them.
"""
