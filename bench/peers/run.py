"""Run one system's enqueuer in its own interpreter; prints one JSON line.

    python -m bench.peers.run SYSTEM bulk N SHAPE
    python -m bench.peers.run SYSTEM paced RATE SECONDS SHAPE

SYSTEM is the module prefix (wurk, rq, celery, dramatiq, huey, arq). The
timing covers the pushes only, not the interpreter's start or the imports.
"""

from __future__ import annotations

import importlib
import json
import sys


def main(argv: list[str]) -> int:
    system, mode, *rest = argv
    module = importlib.import_module(f"bench.peers.{system}_jobs")
    if mode == "bulk":
        n, shape = int(rest[0]), rest[1]
        seconds = module.enqueue_bulk(n, shape)
        print(json.dumps({"jobs": n, "seconds": seconds}), flush=True)
    elif mode == "paced":
        rate, duration, shape = float(rest[0]), float(rest[1]), rest[2]
        jobs, seconds = module.enqueue_paced(rate, duration, shape)
        print(json.dumps({"jobs": jobs, "seconds": seconds}), flush=True)
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
