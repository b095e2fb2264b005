"""Value objects and rules of stock reservation; standard library only."""
