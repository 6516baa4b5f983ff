"""What the cancel step adds to one threaded run, measured in this process.

    python bench/cancel_step.py [--runs 200000] [--rounds 7]

Every threaded job runs inside ``CancelStep.around`` (``wurk.runtime.cancelling``):
the step records which thread runs which jid so a person's cancel can find it.
This times a run of an empty job with and without that wrapper, in rounds that
alternate (A B B A ...) so a busy machine slows both alike, and prints the
median cost per run of each and their difference. Compare the difference with
the worker CPU per job that ``bench/noop_throughput.py`` prints (about 170 us on
a 2-core machine) to see the share of a no-op job's cost that cancel takes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from wurk.runtime.cancelling import CancelStep  # noqa: E402


def empty() -> None:
    return None


def bare(run: Any, runs: int) -> float:
    started = time.perf_counter()
    for _ in range(runs):
        empty()
    return time.perf_counter() - started


def stepped(step: CancelStep, run: Any, runs: int) -> float:
    started = time.perf_counter()
    for _ in range(runs):
        step.around(run, empty)()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200_000, help="runs per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each kind")
    args = parser.parse_args()
    step = CancelStep()
    run = SimpleNamespace(jid="0" * 24, slot="slot", work=object())
    plain: list[float] = []
    wrapped: list[float] = []
    for index in range(args.rounds * 2):
        if (index % 4) in (0, 3):
            plain.append(bare(run, args.runs) / args.runs)
        else:
            wrapped.append(stepped(step, run, args.runs) / args.runs)
    a, b = statistics.median(plain) * 1e6, statistics.median(wrapped) * 1e6
    print(f"cancel step, {args.runs:,} runs x {args.rounds} rounds, Python "
          f"{sys.version.split()[0]}")
    print(f"  an empty job's call:           {a:6.2f} us/run")
    print(f"  inside CancelStep.around:      {b:6.2f} us/run")
    print(f"  the step's cost:               {b - a:6.2f} us/run")


if __name__ == "__main__":
    main()
