"""The compose broker's definitions import into a real RabbitMQ and do what the stack needs.

The file is imported into this session's virtual host (users renamed, so nothing global is
changed for long): every user logs in with the password of the URL that uses it, and once the
worker's topology is declared, each of its queues is governed by the policy meant for it.
Runs on RabbitMQ 3.10 here and 4.x in production: definitions import and policy matching are
the same on both (``apply-to: queues`` rather than the 3.12+ ``quorum_queues``).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import urllib.parse
import uuid
from pathlib import Path

import pytest
from stack import Stack, compose_environment, load_stack

from fulfilment.contracts.topology import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.settings import Settings
from fulfilment.worker.topology import Topology, declare_topology
from services import service_unavailable

pytestmark = pytest.mark.rabbitmq


def _rabbitmqctl(*args: str) -> str:
    result = subprocess.run(
        ["rabbitmqctl", "-q", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"rabbitmqctl {args[0]}: {result.stderr}{result.stdout}"
    return result.stdout


def _passwords(stack: Stack) -> dict[str, str]:
    """User -> password of each AMQP URL that the stack's processes and tools use."""
    urls = [
        compose_environment(stack, "worker")["FULFILMENT_AMQP_URL"],
        Settings.model_fields["amqp_url"].default.get_secret_value(),
    ]
    parsed = [urllib.parse.urlsplit(url) for url in urls]
    return {url.username: url.password for url in parsed if url.username and url.password}


def test_definitions_log_users_in_and_govern_the_queues(amqp_url: str) -> None:
    if shutil.which("rabbitmqctl") is None:
        service_unavailable("rabbitmqctl", FileNotFoundError("rabbitmqctl"))
    stack = load_stack()
    vhost = urllib.parse.unquote(urllib.parse.urlsplit(amqp_url).path.lstrip("/"))
    assert vhost, "the session's own virtual host"
    definitions = json.loads(json.dumps(stack.definitions))
    suffix = uuid.uuid4().hex[:8]
    renamed = {user["name"]: f"{user['name']}-{suffix}" for user in definitions["users"]}
    for user in definitions["users"]:
        user["name"] = renamed[user["name"]]
    for permission in definitions["permissions"]:
        permission["user"] = renamed[permission["user"]]
        permission["vhost"] = vhost
    for policy in definitions["policies"]:
        policy["vhost"] = vhost
    definitions["vhosts"] = [{"name": vhost}]
    passwords = _passwords(stack)
    try:
        # rabbitmqctl may run as the broker's user, who cannot read pytest's private tmp_path.
        with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
            file.write(json.dumps(definitions))
            file.flush()
            Path(file.name).chmod(0o644)
            _rabbitmqctl("import_definitions", file.name)
        for original, name in renamed.items():
            assert original in passwords, f"no URL of the stack logs in as {original}"
            _rabbitmqctl("authenticate_user", name, passwords[original])

        delivery_limit = Settings.model_fields["delivery_limit"].default
        asyncio.run(declare_topology(amqp_url, Topology(delivery_limit=delivery_limit)))
        rows = _rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", "name", "policy")
        policy_of = dict(line.split("\t") for line in rows.splitlines() if line.strip())
        # The policy the static check (stack.check_rabbitmq_policies) matched for each queue
        # with Python's regular expressions is the one the broker applies.
        expected = {
            queue: [
                p["name"] for p in stack.definitions["policies"] if re.search(p["pattern"], queue)
            ]
            for queue in (*(queue.name for queue in SUBSCRIBED_QUEUES), *DEAD_LETTER_QUEUES)
        }
        assert {queue: [policy_of.get(queue)] for queue in expected} == expected
    finally:
        for name in renamed.values():
            subprocess.run(
                ["rabbitmqctl", "-q", "delete_user", name],
                capture_output=True,
                timeout=60,
                check=False,
            )
