"""What per-class metrics cost a job: the run wrapper with ``class_metrics`` on against off.

``python bench/class_metrics.py [--runs N] [--rounds R]`` runs a no-op job
through the processor's run path wrapped as the processor wraps it, on and
off, alternating in the same process (paired rounds: on, off, on, off...),
and prints the per-job price of each and their difference, for one class
and for 50 classes in turn. It then prints what one heartbeat's writes cost
to build for 50 classes (the flush itself is one pipeline per beat, never
per job). No Redis is needed: nothing is written per job.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from wurk.observe.class_metrics import ClassMetrics, flush_commands, tracked
from wurk.settings.config import Config


def run(job: dict[str, Any], queue: str, entry: None) -> None:
    return None


def per_job(wrapped: Any, jobs: list[dict[str, Any]], runs: int) -> float:
    """Microseconds per call over ``runs`` calls cycling through ``jobs``."""
    count = len(jobs)
    started = time.perf_counter()
    for n in range(runs):
        wrapped(jobs[n % count], "default", None)
    return (time.perf_counter() - started) / runs * 1e6


def paired(jobs: list[dict[str, Any]], runs: int, rounds: int) -> tuple[float, float]:
    on = tracked(Config(class_metrics=True), ClassMetrics(), run)
    off = tracked(Config(class_metrics=False), ClassMetrics(), run)
    ons, offs = [], []
    for _ in range(rounds):
        ons.append(per_job(on, jobs, runs))
        offs.append(per_job(off, jobs, runs))
    return statistics.median(ons), statistics.median(offs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for classes in (1, 50):
        jobs = [{"class": f"Job{n}", "args": [], "jid": "x"} for n in range(classes)]
        on, off = paired(jobs, args.runs, args.rounds)
        print(f"{classes:>2} class(es): on {on:.3f} us/job, off {off:.3f} us/job, "
              f"cost {on - off:.3f} us/job (median of {args.rounds} paired rounds)")
    recorder = ClassMetrics()
    for n in range(50):
        for ms in (3, 40, 900):
            recorder.record(f"Job{n}", ms, failed=False)
    started = time.perf_counter()
    commands = flush_commands(recorder.take())
    print(f"one beat, 50 classes: {len(commands)} commands in one pipeline, built in "
          f"{(time.perf_counter() - started) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
