"""``wurk-swarm --topology config.toml``: run a supervised swarm of workers.

The main thread only turns signals into commands for the supervise thread
(read from a wakeup pipe, ``wurk.runtime.signals``; the handlers themselves do
nothing). ``COMMANDS`` maps each signal to its command; what each does is in
docs/reference/signals-and-exit-codes.md, the one table of every entry
point's signals (a test compares it with ``COMMANDS``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence

from supervisor.probe import probe
from supervisor.swarm import Swarm
from supervisor.topology import Topology, TopologyError, load
from wurk.core import logging as wlog
from wurk.core.arguments import Parser, number, one_line
from wurk.core.redaction import redact_text
from wurk.runtime.signals import SignalPipe
from wurk.version import __version__

EX_CONFIG = 78
# Linux's largest pid_max (PID_MAX_LIMIT on 64-bit).
MAX_PID = 4_194_304

COMMANDS = {
    signal.SIGTERM: "shutdown", signal.SIGINT: "shutdown", signal.SIGTSTP: "quiet",
    signal.SIGHUP: "restart", signal.SIGUSR1: "restart", signal.SIGTTIN: "more",
    signal.SIGTTOU: "fewer", signal.SIGUSR2: "status",
}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="wurk-swarm", description="Run a supervised swarm of wurk worker processes.")
    parser.add_argument("--version", action="version", version=f"wurk-swarm (wurk {__version__})")
    parser.add_argument("-t", "--topology", required=True, help="the topology TOML file")
    parser.add_argument("--check", action="store_true",
                        help="validate the topology and exit (0 if valid, 78 if not)")
    parser.add_argument("--probe", action="store_true",
                        help="exit 0 if every child of the swarm on this host beats in Redis "
                             "(at least one per slot, none stale)")
    parser.add_argument("--pid", type=number(int, 1, MAX_PID), default=1,
                        help="with --probe: the swarm parent's pid (default 1, as in a container)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        topology = load(args.topology)
    except TopologyError as exc:
        print(one_line(f"wurk-swarm: {exc}"), file=sys.stderr)
        return EX_CONFIG
    if args.check:
        print(f"wurk-swarm: {args.topology} is valid "
              f"({sum(s.count for s in topology.slots)} children in {len(topology.slots)} slots)")
        return 0
    if args.probe:
        return _probe(topology, args.pid)
    wlog.setup(topology.base.log_level, topology.base.log_format)
    return run(Swarm(topology))


def _probe(topology: Topology, pid: int) -> int:
    try:
        result = probe(topology, pid)
    except Exception as exc:  # noqa: BLE001 - a probe answers, it does not crash
        print(one_line(redact_text(f"wurk-swarm: probe failed: {type(exc).__name__}: {exc}")),
              file=sys.stderr)
        return 1
    counts = ", ".join(f"{name}: {n}" for name, n in result.fresh.items())
    print(f"wurk-swarm: children beating per slot: {counts}")
    if result.stale:
        print(f"wurk-swarm: stale children: {', '.join(result.stale)}")
    return 0 if result.ok else 1


def run(swarm: Swarm) -> int:
    with SignalPipe(COMMANDS) as signals:
        swarm.register_drain_hooks()
        thread = swarm.start_supervising(daemon=False)
        waker = threading.Thread(target=_wake_when_done, args=(swarm, signals), daemon=True)
        waker.start()
        try:
            while not swarm.wait_finished(0):
                number = signals.next()
                name = command_for(number)
                if name:
                    swarm.command(name)
        finally:
            thread.join()
    return swarm.supervised if swarm.supervised is not None else 1


def command_for(number: int | None) -> str | None:
    """The swarm command a signal number asks for, if any.

    The wakeup pipe also carries signals that a module loaded in the parent
    installed a handler for (a real-time signal has no ``signal.Signals``
    member): they are not ours, and must not stop the main loop.
    """
    if not number:
        return None
    try:
        return COMMANDS.get(signal.Signals(number))
    except ValueError:
        return None


def _wake_when_done(swarm: Swarm, signals: SignalPipe) -> None:
    """Unblock the main thread's read once the supervise thread has finished."""
    swarm.wait_finished()
    signals.poke(0)  # no signal has number 0


if __name__ == "__main__":
    sys.exit(main())
