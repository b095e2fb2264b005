"""The leader-elected pump that the relay and the dispatcher are built on (``pump.leader``)."""
