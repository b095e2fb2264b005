"""Use cases and the ports they need; imports the domain only."""
