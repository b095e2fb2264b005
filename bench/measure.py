"""CPU seconds of the processes under test, the broker and PostgreSQL, from the kernel's counters.

A thread reads user + system CPU time (``/proc/<pid>/stat`` through psutil) of these groups of
processes every :data:`SAMPLE_SECONDS`:

- one group per process under test, by name (``consumer`` for the worker or the reference,
  ``relay`` for the ``fulfilment relay`` that publishes the worker's outbox, ...): the
  benchmark's list of the service's processes decides which;
- ``broker``: ``beam.smp`` (the whole broker: other virtual hosts' traffic counts too);
- ``postgres``: the backends of the benchmark's database (their process title names it) and
  the server's shared processes (WAL writer, checkpointer, ...), not other databases' backends;
- ``rest``: everything else the machine ran (busy time of all CPUs minus the groups above),
  the benchmark's own publisher included. A large value means the figures are disturbed.

The CPU spent between two moments is interpolated linearly between the samples around them.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

SAMPLE_SECONDS = 0.2
"""Time between two samples."""

BROKER_PROCESS = "beam.smp"
DATABASE_PROCESS = "postgres"
DATABASE_SHARED_PROCESSES = (
    "checkpointer",
    "background writer",
    "walwriter",
    "autovacuum launcher",
    "logical replication launcher",
    "archiver",
)
"""Process titles (after ``postgres: <cluster>: ``) of the server's processes shared by all
databases; a backend's title starts with its user and database instead."""

SHARED_GROUPS = ("broker", "postgres", "rest")
"""The groups every sampler has after its processes' own."""


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


@dataclass
class _Group:
    """Cumulative CPU seconds of a changing set of processes; exited ones keep their last value."""

    last: dict[tuple[int, float], float] = field(default_factory=dict)

    def update(self, processes: Sequence[psutil.Process]) -> float:
        for process in processes:
            try:
                self.last[process.pid, process.create_time()] = _cpu(process)
            except psutil.Error:
                continue
        return sum(self.last.values())


class CpuSampler:
    """Samples the CPU seconds of each group of ``processes``, the broker and PostgreSQL.

    In a thread. Use as a context manager; :meth:`between` then gives the seconds each group
    spent between two wall-clock moments (``time.time()``, the clock PostgreSQL's ``now()``
    also follows). ``processes`` maps a group's name to a function that returns its process
    ids now (they start and stop while the sampler runs).
    """

    def __init__(self, processes: Mapping[str, Callable[[], Sequence[int]]], database: str) -> None:
        self._pids = dict(processes)
        self._database = database
        self.groups = (*self._pids, *SHARED_GROUPS)
        """Every group's name: ``processes``' then :data:`SHARED_GROUPS`."""
        self._groups = {name: _Group() for name in self.groups if name != "rest"}
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> Self:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self._sample()

    def _sample(self) -> None:
        broker: list[psutil.Process] = []
        database: list[psutil.Process] = []
        for process in psutil.process_iter(["name", "cmdline"]):
            name = process.info["name"]
            if name == BROKER_PROCESS:
                broker.append(process)
            elif name == DATABASE_PROCESS and self._ours(process.info["cmdline"] or []):
                database.append(process)
        machine = psutil.cpu_times()
        now = time.time()
        values = {
            name: self._groups[name].update(_processes(pids())) for name, pids in self._pids.items()
        }
        values |= {
            "broker": self._groups["broker"].update(broker),
            "postgres": self._groups["postgres"].update(database),
        }
        busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
        values["rest"] = busy - sum(values.values())
        self.samples.append((now, values))

    def _ours(self, title: Sequence[str]) -> bool:
        """Whether a ``postgres`` process is one of the benchmark database or a shared one."""
        text = " ".join(title)
        if not text.startswith("postgres: "):
            return True  # the postmaster itself
        role = text.split(": ", 2)[-1]
        return role.startswith(DATABASE_SHARED_PROCESSES) or f" {self._database} " in f" {role} "

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per group (:attr:`groups`) between ``start`` and ``end`` (epoch seconds)."""
        return {group: self._at(end, group) - self._at(start, group) for group in self.groups}

    def _at(self, moment: float, group: str) -> float:
        times = [sample[0] for sample in self.samples]
        index = bisect.bisect_left(times, moment)
        if index == 0:
            return self.samples[0][1][group]
        if index == len(times):
            return self.samples[-1][1][group]
        (t0, v0), (t1, v1) = self.samples[index - 1], self.samples[index]
        return v0[group] + (v1[group] - v0[group]) * (moment - t0) / (t1 - t0)


def _processes(pids: Sequence[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return found


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set size (``VmHWM`` of ``/proc/<pid>/status``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    msg = f"no VmHWM for process {pid}"
    raise RuntimeError(msg)
