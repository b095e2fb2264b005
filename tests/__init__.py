"""The test suite; its helpers are modules of its packages, never top-level names."""
