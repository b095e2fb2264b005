"""The dispatcher: the process that sends the recorded warehouse requests."""
