"""The HTTP server's socket is bound by the service's root, which says in one line, exit 1,
which variable to change when the bind fails (uvicorn would exit 3, an unreachable service's
code, after a bare log line)."""

from __future__ import annotations

import socket

import pytest

from fulfilment.entrypoints.startup import StartRefusedError, listen
from fulfilment.exit_codes import ExitCode

NOT_ON_THIS_HOST = "192.0.2.1"
"""TEST-NET-1 (RFC 5737): an address no interface of a test machine has."""


@pytest.mark.parametrize(
    ("host", "family"), [("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)]
)
def test_the_socket_listens_on_the_address_of_the_settings(host: str, family: int) -> None:
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    with listen(host, 0, program="worker", port_variable="FULFILMENT_HTTP_PORT") as listening:
        assert listening.family == family
        assert listening.getsockname()[0] == host


def test_a_port_another_process_holds_stops_the_start_naming_the_port_variable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        with pytest.raises(StartRefusedError) as raised:
            listen("127.0.0.1", port, program="relay", port_variable="FULFILMENT_RELAY_HTTP_PORT")

    assert raised.value.event == "relay.http_listen_failed"
    assert raised.value.exit_code == ExitCode.FAILED
    assert str(raised.value) == (
        f"the HTTP server of the relay cannot listen on 127.0.0.1:{port}: another process holds the"
        " port; set FULFILMENT_RELAY_HTTP_PORT to a free one: [Errno 98] Address already in use"
    )


def test_an_address_of_no_interface_stops_the_start_naming_the_host_variable() -> None:
    with pytest.raises(StartRefusedError) as raised:
        listen(NOT_ON_THIS_HOST, 8080, program="worker", port_variable="FULFILMENT_HTTP_PORT")

    assert raised.value.event == "worker.http_listen_failed"
    assert raised.value.exit_code == ExitCode.FAILED
    assert str(raised.value) == (
        f"the HTTP server of the worker cannot listen on {NOT_ON_THIS_HOST}:8080: no interface of"
        " this host has that address; set FULFILMENT_HTTP_HOST to one: [Errno 99] Cannot"
        " assign requested address"
    )
