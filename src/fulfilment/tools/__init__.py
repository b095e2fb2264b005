"""The operator tools: what the ``fulfilment`` command's sub-commands do.

Each sub-command is one ``*_command`` function (see ``command``): ``dlq_commands`` (list, show,
replay and purge, over ``dlq``), ``report`` (report, and the check behind reconcile),
``stock_csv`` (stock load), ``outbox`` (prune) and ``migrate``. The commands that read the
Online Retail files (publish, reconcile, stock plan) are ``fulfilment.dataset``'s, and the
demo is ``fulfilment.demo``; neither is imported here. Built by ``fulfilment.entrypoints.cli``;
the worker never imports them.
"""
