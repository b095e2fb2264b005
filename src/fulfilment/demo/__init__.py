"""``fulfilment demo``: the service's main job played on the Online Retail data set.

``run`` is the command (migrate, load stock, run the worker and the relay, play the data day
by day, reconcile, report); ``player`` plays the days, ``children`` starts and stops the
processes, ``warehouse_system`` runs the simulator, the intake (``fulfilment webhooks``) and
the dispatcher, ``handoff`` checks what the warehouse received and ``warehouse_news`` what it
sent back, ``reset`` guards ``--reset``, and ``result_events`` tallies the result
events the demo's own queue received. It stands on the operator tools and the data set
(``fulfilment.dataset``); nothing but ``fulfilment.entrypoints.cli`` imports it.

Not in the production wheel (``pyproject.toml``'s wheel ``exclude``): ``--reset`` truncates
the service's tables, so the image does not carry it, and ``fulfilment demo`` there exits 2
with one line. A checkout's editable install (``make install``, ``make demo``) has it.
"""
