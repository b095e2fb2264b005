"""The deployment files' per-queue parts agree with the routes' queues (scripts/render-deploy).

The broker definitions, the queue policies, the KEDA triggers and the alerts that name every
queue are rendered from ``fulfilment.routes.table.SUBSCRIBED_QUEUES``; a new route whose
transport is a queue leaves them stale until ``make deploy-files`` runs.
"""

from __future__ import annotations

import json
import runpy
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from fulfilment.routes.table import SUBSCRIBED_QUEUES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = runpy.run_path(str(ROOT / "scripts/render-deploy"))


def test_the_rendered_deployment_files_are_current() -> None:
    stale = [str(path.relative_to(ROOT)) for path in SCRIPT["stale_files"]()]

    assert stale == [], f"{stale} are out of date with the routes' queues: run make deploy-files"


def test_a_new_queue_makes_every_rendered_file_stale() -> None:
    new = replace(
        SUBSCRIBED_QUEUES[0],
        event="order_held",
        routing_key="order.held",
        name="fulfilment.order-held",
        dead_letter_queue="fulfilment.order-held.dlq",
    )

    stale = SCRIPT["stale_files"]((*SUBSCRIBED_QUEUES, new))

    assert sorted(stale) == sorted(SCRIPT["rendered_files"](SUBSCRIBED_QUEUES))


def test_a_new_queue_gets_its_policies_trigger_and_alerts() -> None:
    new = replace(
        SUBSCRIBED_QUEUES[0],
        event="order_held",
        routing_key="order.held",
        name="fulfilment.order-held",
        dead_letter_queue="fulfilment.order-held.dlq",
    )
    queues = (*SUBSCRIBED_QUEUES, new)
    files: dict[Path, Any] = SCRIPT["rendered_files"](queues)
    rendered = {path.name: render(path.read_text()) for path, render in files.items()}

    policies = [
        document["spec"] for document in yaml.safe_load_all(rendered["rabbitmq-policy.yaml"])
    ]
    assert {"^fulfilment\\.order-held$", "^fulfilment\\.order-held\\.dlq$"} <= {
        policy["pattern"] for policy in policies
    }
    [scaled, _] = yaml.safe_load_all(rendered["scaledobject.yaml"])
    assert [t["metadata"]["queueName"] for t in scaled["spec"]["triggers"]] == [
        queue.name for queue in queues
    ]
    assert (
        'absent(fulfilment_queue_messages_ready{queue="fulfilment.order-held.dlq"})'
        in (rendered["alerts.yml"])
    )
    assert (
        'absent(fulfilment_queue_consumers{queue="fulfilment.order-held"})'
        in (rendered["alerts.yml"])
    )
    definitions = json.loads(rendered["definitions.json"])
    assert [policy["name"] for policy in definitions["policies"]][-2:] == [
        "fulfilment-order-held",
        "fulfilment-order-held-dlq",
    ]
