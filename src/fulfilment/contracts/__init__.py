"""Wire models of the messages the service consumes (pydantic stays at this edge)."""
