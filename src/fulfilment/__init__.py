"""Order-fulfilment worker: reserves stock for ``OrderPlaced`` events, once per event."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fulfilment")
except PackageNotFoundError:  # pragma: no cover - only when run from a source tree without install
    __version__ = "0.0.0+unknown"
