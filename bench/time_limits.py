"""What time limits cost a job: the per-job price of reading and arming them.

``python bench/time_limits.py [--runs N]`` prints, per job, the cost of

1. ``time_limits.read`` on a payload with no limit (every job pays this),
2. ``JobTimer.run`` arming and ending a soft limit that never fires (what a
   job with ``timeout`` pays), against calling the job directly,
3. the same with a hard limit too (two heap entries).

No Redis is needed: only the timer's in-process path is measured. The
processor adds nothing else for a job without limits, and no timer thread
runs until a job with a limit does.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from wurk.push.options import make_options
from wurk.runtime.job_timer import JobTimer
from wurk.runtime.time_limits import Limits, read
from wurk.runtime.work import UnitOfWork


def per_call(fn: Callable[[], object], runs: int) -> float:
    """Best of three passes, in microseconds per call."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(runs):
            fn()
        best = min(best, (time.perf_counter() - started) / runs)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    runs = parser.parse_args().runs
    job = {"class": "X", "args": [], "jid": "abc", "queue": "default"}
    options = make_options()
    timer = JobTimer(None, None)  # type: ignore[arg-type]
    work = UnitOfWork("default", b"{}")
    soft = Limits(timeout=60.0)
    both = Limits(timeout=60.0, hard_timeout=120.0)

    def nothing() -> None:
        return None

    try:
        rows = [
            ("read limits, none set", per_call(lambda: read(job, options), runs)),
            ("job called directly", per_call(nothing, runs)),
            ("job under a soft limit", per_call(
                lambda: timer.run("s", work, job, None, limits=soft, call=nothing), runs)),
            ("job under soft + hard limits", per_call(
                lambda: timer.run("s", work, job, None, limits=both, call=nothing), runs)),
        ]
    finally:
        timer.stop()
    for name, micros in rows:
        print(f"{name:32} {micros:8.2f} us/job")


if __name__ == "__main__":
    main()
