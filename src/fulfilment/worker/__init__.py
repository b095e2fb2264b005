"""The worker, built by ``fulfilment.entrypoints.worker``.

Its edge towards the broker (subscribers, the delivery policy, topology, consumer control),
its health endpoints and its background monitors. It never imports the operator tools.
"""
