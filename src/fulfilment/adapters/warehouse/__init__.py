"""The warehouse system (WMS or 3PL) over HTTP: its client and the classes of its answers."""
