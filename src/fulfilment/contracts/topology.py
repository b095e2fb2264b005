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

ORDER_CANCELLED_ROUTING_KEY = "order.cancelled"
ORDER_CANCELLED_QUEUE = "fulfilment.order-cancelled"
ORDER_CANCELLED_DEAD_LETTER_QUEUE = "fulfilment.order-cancelled.dlq"

ORDER_SHIPPED_ROUTING_KEY = "order.shipped"
ORDER_SHIPPED_QUEUE = "fulfilment.order-shipped"
ORDER_SHIPPED_DEAD_LETTER_QUEUE = "fulfilment.order-shipped.dlq"
