"""Order-fulfilment worker: reserves stock for ``OrderPlaced`` events, once per event.

Importing the package imports nothing: the ``fulfilment`` program's entry point
(``entrypoints.console``) is inside it, and a Ctrl-C before that module's guard runs ends the
program with a ``KeyboardInterrupt`` instead of one line and 130. ``__version__`` (the
installed distribution's, ``0.0.0+unknown`` in a source tree without install) is read from the
package metadata on first use, as ``importlib.metadata`` alone takes tens of milliseconds to
load.
"""

# Not typing's: importing typing costs what this module saves; mypy takes any TYPE_CHECKING as True.
TYPE_CHECKING = False
if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        if name != "__version__":
            message = f"module {__name__!r} has no attribute {name!r}"
            raise AttributeError(message)
        from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - see above

        try:
            found = version("fulfilment")
        except PackageNotFoundError:  # pragma: no cover - a source tree without install
            found = "0.0.0+unknown"
        globals()["__version__"] = found  # looked up once
        return found
