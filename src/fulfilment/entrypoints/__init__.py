"""Ways into the service: the AMQP subscriber, HTTP endpoints and the command line."""
