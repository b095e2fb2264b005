"""Names of the RabbitMQ topology in the product contract, shared by the worker and the tools.

The worker declares these objects at start (``fulfilment.worker.topology``); the operator tools
only name them. Renaming one is a change of the external contract.
"""

ORDERS_EXCHANGE = "orders"
ORDER_PLACED_ROUTING_KEY = "order.placed"
MAIN_QUEUE = "fulfilment.order-placed"
DEAD_LETTER_EXCHANGE = "fulfilment.dlx"
DEAD_LETTER_QUEUE = "fulfilment.order-placed.dlq"
DEAD_LETTER_ROUTING_KEY = MAIN_QUEUE
"""Dead letters are routed by the name of the queue they died in, so more queues can share
the exchange later."""
