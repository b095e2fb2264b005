"""The service's inputs: one route per input event, in one list (``routes.table.ROUTES``).

A route is everything the service knows of one input event: how it arrives (its transport),
its wire model, its handler, the outcome labels the handler counts, and the SQL function that
applies its command. The worker's subscriptions, ``SUBSCRIBED_QUEUES``, the AsyncAPI
document, the outcome metrics' labels, the runtime role's grants and the deployment files
(``scripts/render-deploy``) are all made from that list.

This package sits between the adapters and the wire models: the adapters read the list (the
PostgreSQL store finds a command's SQL function in it, the grants name its functions), and it
reads only the wire models, the ports and the domain.
"""
