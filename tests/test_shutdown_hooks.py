"""``on_shutdown`` hooks: called once a worker has stopped, in every kind of worker.

A swarm child leaves by ``os._exit`` and runs no ``atexit`` handler, so
this is where a tracer or an error reporter flushes what it still holds.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import textwrap
from collections.abc import Callable
from pathlib import Path

import cli_workers
import pytest
import redis
import swarms
from swarms import Launch, slot
from waiting import wait_for

from wurk.runtime.embedded import Embedded
from wurk.settings.config import Config

spawn = cli_workers.spawn
jobs_dir = cli_workers.jobs_dir
launch = swarms.launch

# Appends one line per hook call to $BYE_FILE: "<pid> first", then a hook
# that raises, then "<pid> last" (the raising one must not stop the last).
BYE_MODULE = textwrap.dedent("""
    import os

    from wurk.settings.config import when_configured


    def _line(word):
        def hook():
            with open(os.environ["BYE_FILE"], "a") as fh:
                fh.write(f"{os.getpid()} {word}\\n")
        return hook


    def _boom():
        raise RuntimeError("a broken hook")


    def _install(config):
        if not any(getattr(h, "__name__", "") == "hook" for h in config.on_shutdown):
            config.on_shutdown.extend([_line("first"), _boom, _line("last")])


    when_configured(_install)
""")


def lines_by_pid(path: Path) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        pid, word = line.split()
        found.setdefault(int(pid), []).append(word)
    return found


def test_an_embedded_worker_calls_its_hooks_on_stop_and_a_raising_one_stops_none(
        config: Config) -> None:
    calls: list[str] = []

    def boom() -> None:
        raise RuntimeError("broken")

    hooked = dataclasses.replace(config, on_shutdown=[lambda: calls.append("first"), boom,
                                                      lambda: calls.append("last")])
    embedded = Embedded(hooked).start()
    assert calls == []
    embedded.stop()
    embedded.stop()  # idempotent: the hooks run once
    assert calls == ["first", "last"]


def test_wurk_run_calls_its_hooks_after_the_stop(
        spawn: Callable[..., cli_workers.Worker], jobs_dir: Path, r: redis.Redis) -> None:
    (jobs_dir / "byehook.py").write_text(BYE_MODULE)
    bye = jobs_dir / "bye.txt"
    worker = spawn("-r", "clijobs", "-r", "byehook", BYE_FILE=str(bye),
                   WURK_LOG_FORMAT="json")
    cli_workers.registered_identity(r, worker)
    assert not bye.exists()
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.stderr()
    assert lines_by_pid(bye) == {worker.proc.pid: ["first", "last"]}
    assert any(e.get("event") == "shutdown_hook.failed" for e in worker.events())


@pytest.mark.usefixtures("r")
def test_each_swarm_child_calls_its_hooks_before_it_exits(launch: Launch,
                                                          tmp_path: Path) -> None:
    (tmp_path / "byehook.py").write_text(BYE_MODULE)
    bye = tmp_path / "bye.txt"
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]), layout={"alpha": 2},
                   env={"BYE_FILE": str(bye)}, require=["swarm_jobs", "byehook"])
    swarm.wait_ready()
    children = swarm.child_pids()
    assert len(children) == 2
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(30) == 0
    wait_for(lambda: set(lines_by_pid(bye)) >= children, timeout=5)
    by_pid = lines_by_pid(bye)
    for pid in children:
        assert by_pid[pid] == ["first", "last"]
    # The parent runs no worker, so it has no worker hooks to call.
    assert os.getpid() not in by_pid and swarm.pid not in by_pid
