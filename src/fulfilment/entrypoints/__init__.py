"""The programs: the ``fulfilment`` command line and the roots of the long-running services.

``console`` is the console script's entry point and loads ``cli``; ``worker``, ``relay`` and
``dispatcher`` each build and run one service from the settings; ``startup`` is what they
share (settings read once, logging, the database's options, the run loop of a service).
Nothing outside this package imports it.
"""
