"""The operator tools: what the ``fulfilment`` command's sub-commands do.

Each sub-command is one ``*_command`` function (see ``command``): ``dlq_commands`` (list, show,
replay and purge, over ``dlq``), ``report`` (report and reconcile), ``demo``, ``stock_csv``
(stock load), ``stock_plan`` (stock plan), ``publish`` and ``migrate``; ``online_retail`` reads
the orders they publish. Built by ``fulfilment.cli``; the worker never imports them.
"""
