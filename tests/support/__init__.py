"""The suite's shared helpers: builders, fakes, services, private brokers."""
