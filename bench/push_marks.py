"""What a push's connection mark costs: perform_async from one thread, paired.

    python bench/push_marks.py [--jobs 1000] [--rounds 60]

Against a private redis-server (free loopback port, no persistence) that it
starts and stops itself, one process pushes ``--jobs`` no-op jobs with
``perform_async`` per turn, alternating three write paths turn by turn (the
order reversed every other round), so load from elsewhere on the machine
falls on all of them alike:

* ``before``: the write wurk made before pushes were marked (``SADD`` and
  ``LPUSH`` in one pipeline, no mark), rebuilt here;
* ``after``: today's write (:mod:`wurk.push.landing`): one call of the
  ``push_marked`` script for a one-job push;
* ``multi``: the same writes and mark in a ``MULTI``/``EXEC`` (what a bulk
  slice sends), for one job.

Printed: median jobs/s of each, the median and quartiles of the per-round
ratio to ``before``, and the median client CPU (this process) and Redis CPU
(``INFO cpu``) per push.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import wurk
from wurk.push import landing
from wurk.push.client import Client
from wurk.push.confirmed import ConfirmedPush
from wurk.push.exchange import Commands, Flow
from wurk.push.writer import Writer
from wurk.wire import keys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def before_write(self: Writer, content: ConfirmedPush, payloads: Any = ()) -> Flow[None]:
    """The write before marks: the bare commands, sent once."""
    commands: list[tuple[Any, ...]] = [("SADD", keys.QUEUES, *{j.queue for j in content.jobs})]
    commands += [("LPUSH", keys.queue(j.queue), j.raw) for j in content.jobs]
    yield Commands(tuple(commands), idempotent=False)


def multi_commands(self: Any, conn: object) -> tuple[bool, list[tuple[Any, ...]]]:
    mark = landing._marks.next(conn)
    earlier, self.marks = self.marks, [*self.marks, mark]
    if earlier:
        return True, [landing.checked(self.push, mark, earlier)]
    return False, landing.marked(self.push, mark)


def redis_cpu(pool: Any) -> float:
    info = pool.call("INFO", "cpu").decode()
    fields = dict(line.split(":", 1) for line in info.split("\r\n") if ":" in line)
    return float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=60)
    opts = parser.parse_args()
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        run(port, opts.jobs, opts.rounds)
    finally:
        server.terminate()


def run(port: int, jobs: int, rounds: int) -> None:
    wurk.configure(wurk.Config(redis_url=f"redis://127.0.0.1:{port}/0", reliable_push=False))

    @wurk.job(name="Noop")
    def noop(i: int) -> None:
        pass

    after_write, after_commands = Writer.write, landing._Attempt.commands
    arms = {"before": (before_write, after_commands), "after": (after_write, after_commands),
            "multi": (after_write, multi_commands)}
    for i in range(2000):
        noop.perform_async(i)  # warm: connection, script, caches
    pool = Client.default().pool
    rates: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in (list(arms) if r % 2 else list(reversed(arms))):
            Writer.write, landing._Attempt.commands = arms[name]  # type: ignore[method-assign]
            pool.call("DEL", keys.queue("default"))
            r0, c0, w0 = redis_cpu(pool), time.process_time(), time.perf_counter()
            for i in range(jobs):
                noop.perform_async(i)
            wall, client = time.perf_counter() - w0, time.process_time() - c0
            rates[name].append(jobs / wall)
            cpu[name].append((client / jobs * 1e6, (redis_cpu(pool) - r0) / jobs * 1e6))
    for name in arms:
        ratios = [a / b for a, b in zip(rates[name], rates["before"], strict=True)]
        quartiles = [round(q, 3) for q in statistics.quantiles(ratios, n=4)]
        print(f"{name:6s} {statistics.median(rates[name]):7.0f} jobs/s  ratio to before: "
              f"median {statistics.median(ratios):.3f}, quartiles {quartiles}  CPU per push: "
              f"client {statistics.median(c for c, _ in cpu[name]):5.1f} us, "
              f"redis {statistics.median(r for _, r in cpu[name]):5.1f} us")


if __name__ == "__main__":
    main()
