"""The simulator's HTTP server: uvicorn on a real socket, in the caller's event loop.

``async with SimulatorServer(WarehouseSimulator()) as server:`` listens on ``server.url``
(port 0: a free one) until the block ends. An outage in ``refuse`` mode stops the server, so
that connections are refused, and starts it again on the same port when the outage ends; the
warehouse's state lives in the :class:`~.app.WarehouseSimulator`, which outlives the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from types import TracebackType
from typing import Self

import uvicorn

from warehouse_simulator.app import WarehouseSimulator

SHUTDOWN_SECONDS = 1
"""How long a stop waits for requests in flight (a stalled one is abandoned after it)."""


class SimulatorServer:
    """uvicorn serving ``simulator`` on ``host``:``port`` (0: a free port, see :attr:`port`)."""

    def __init__(
        self, simulator: WarehouseSimulator, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.simulator = simulator
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._serving: asyncio.Task[None] | None = None
        self._restart: asyncio.Task[None] | None = None
        simulator.on_refuse = self._refuse_for

    @property
    def url(self) -> str:
        """The API's base URL, e.g. ``http://127.0.0.1:8090/api/v1``."""
        return f"http://{self.host}:{self.port}{self.simulator.base_path}"

    @property
    def admin_url(self) -> str:
        """The admin endpoints' base, e.g. ``http://127.0.0.1:8090/_simulator``."""
        return f"http://{self.host}:{self.port}/_simulator"

    async def start(self) -> None:
        """Listen, and serve in a task of the running loop.

        Raises:
            OSError: the port is taken.
        """
        listening = socket.create_server((self.host, self.port), reuse_port=False)
        # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and
        # create_server's is 0: without it Nagle holds the second write of each answer
        # until the client's delayed ACK, 40 ms on every request of a kept-alive connection.
        # Linux gives the accepted connections the listening socket's setting.
        listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.port = listening.getsockname()[1]
        config = uvicorn.Config(
            self.simulator,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=SHUTDOWN_SECONDS,
            # Keep-alive connections live longer than a test's pauses between requests.
            timeout_keep_alive=30,
        )
        server = _QuietServer(config)
        self._server = server
        self._serving = asyncio.create_task(server.serve(sockets=[listening]))
        while not server.started:
            if self._serving.done():
                await self._serving
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop serving (requests in flight get :data:`SHUTDOWN_SECONDS`)."""
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            # wait(), not await: a stop cancelled half-way (an outage's restart, cancelled by
            # close()) must not cancel the server's task, which close() then waits for.
            await asyncio.wait([self._serving])
        self._server = self._serving = None

    async def close(self) -> None:
        """Stop serving and cancel a restart an outage scheduled; stop the work and webhooks."""
        if self._restart is not None:
            self._restart.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._restart
        await self.stop()
        await self.simulator.close()

    def _refuse_for(self, seconds: float) -> None:
        async def outage() -> None:
            await self.stop()
            await asyncio.sleep(seconds)
            await self.start()

        self._restart = asyncio.get_running_loop().create_task(outage())

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        _type: type[BaseException] | None,
        _error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        await self.close()


class _QuietServer(uvicorn.Server):
    """uvicorn without signal handlers: the caller (a test, ``__main__``) owns the signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install no signal handler."""
        yield
