"""CPU seconds of the consumer, the broker and PostgreSQL, sampled from the kernel's counters.

A thread reads user + system CPU time (``/proc/<pid>/stat`` through psutil) of three groups of
processes every :data:`SAMPLE_SECONDS`: the consumer under test, the broker (``beam.smp``) and
PostgreSQL (every ``postgres`` process, plus what the postmaster collected from backends that
have exited, so a connection that comes and goes is still counted). The CPU spent between two
moments is interpolated linearly between the samples around them.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import psutil

SAMPLE_SECONDS = 0.2
"""Time between two samples."""

BROKER_PROCESS = "beam.smp"
DATABASE_PROCESS = "postgres"


def _cpu(process: psutil.Process, *, with_children: bool = False) -> float:
    times = process.cpu_times()
    total = times.user + times.system
    if with_children:
        total += times.children_user + times.children_system
    return total


@dataclass
class _Group:
    """Cumulative CPU seconds of a changing set of processes; exited ones keep their last value."""

    last: dict[tuple[int, float], float] = field(default_factory=dict)

    def update(self, processes: Sequence[psutil.Process], *, reaper: int | None = None) -> float:
        for process in processes:
            try:
                key = (process.pid, process.create_time())
                # The postmaster's children times are its exited backends: count them too.
                self.last[key] = _cpu(process, with_children=process.pid == reaper)
            except psutil.Error:
                continue
        return sum(self.last.values())


class CpuSampler:
    """Samples the CPU seconds of ``consumers()``, the broker and PostgreSQL in a thread.

    Use as a context manager; :meth:`between` then gives the seconds each group spent between
    two wall-clock moments (``time.time()``, the clock PostgreSQL's ``now()`` also follows).
    """

    def __init__(self, consumers: Callable[[], Sequence[int]]) -> None:
        self._consumers = consumers
        self._groups = {"consumer": _Group(), "broker": _Group(), "postgres": _Group()}
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
        for process in psutil.process_iter(["name"]):
            name = process.info["name"]
            if name == BROKER_PROCESS:
                broker.append(process)
            elif name == DATABASE_PROCESS:
                database.append(process)
        postmaster = _postmaster(database)
        consumers = []
        for pid in self._consumers():
            try:
                consumers.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
        now = time.time()
        self.samples.append(
            (
                now,
                {
                    "consumer": self._groups["consumer"].update(consumers),
                    "broker": self._groups["broker"].update(broker),
                    "postgres": self._groups["postgres"].update(database, reaper=postmaster),
                },
            )
        )

    def between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds of ``consumer``, ``broker`` and ``postgres`` from ``start`` to ``end``."""
        return {group: self._at(end, group) - self._at(start, group) for group in self._groups}

    def _at(self, moment: float, group: str) -> float:
        times = [sample[0] for sample in self.samples]
        index = bisect.bisect_left(times, moment)
        if index == 0:
            return self.samples[0][1][group]
        if index == len(times):
            return self.samples[-1][1][group]
        (t0, v0), (t1, v1) = self.samples[index - 1], self.samples[index]
        return v0[group] + (v1[group] - v0[group]) * (moment - t0) / (t1 - t0)


def _postmaster(processes: Sequence[psutil.Process]) -> int | None:
    pids = {process.pid for process in processes}
    for process in processes:
        try:
            if process.ppid() not in pids:
                return process.pid
        except psutil.Error:
            continue
    return None


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set size (``VmHWM`` of ``/proc/<pid>/status``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    msg = f"no VmHWM for process {pid}"
    raise RuntimeError(msg)
