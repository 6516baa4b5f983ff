"""What a running worker's log lines say about each job (``wurk run``, JSON).

Every job line carries what finds the job again in a busy host: the pid,
Sidekiq's ``tid`` (the thread, as named in the work hash), jid, class and
queue, and ``elapsed`` when it ends; a failure carries its traceback; a
drain names the jids it pushed back.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from cli_workers import Worker, jobs_dir, push, spawn  # noqa: F401 - fixtures
from waiting import wait_for

FAILING = '''
import wurk

@wurk.job(name="log_explode", retry=3)
def explode(value):
    raise ValueError(f"boom {value}")
'''


def events_named(worker: Worker, name: str) -> list[dict[str, Any]]:
    return [e for e in worker.events() if e.get("event") == name]


def test_job_lines_carry_pid_tid_jid_class_queue_and_a_failure_its_traceback(
        r: redis.Redis, spawn: Callable[..., Worker], jobs_dir: Path) -> None:  # noqa: F811
    (jobs_dir / "logfailjobs.py").write_text(FAILING)
    ok_jid, _ = push(r, "cli_echo", 1)
    bad_jid, _ = push(r, "log_explode", 2)
    worker = spawn("-r", "clijobs", "-r", "logfailjobs", "--log-level", "info", "-c", "2")
    wait_for(lambda: events_named(worker, "job.done") and events_named(worker, "job.fail"),
             what="one job done and one failed")
    for name, jid, cls in (("job.start", ok_jid, "cli_echo"), ("job.done", ok_jid, "cli_echo"),
                           ("job.fail", bad_jid, "log_explode")):
        [line] = [e for e in events_named(worker, name) if e["jid"] == jid]
        assert (line["pid"], line["class"], line["queue"]) == (worker.proc.pid, cls, "default")
        assert isinstance(line["tid"], str) and line["tid"]
        if name != "job.start":
            assert line["elapsed"] >= 0
    [failed] = events_named(worker, "job.fail")
    assert failed["error"] == "ValueError: boom 2"
    assert "Traceback" in failed["exception"] and "in explode" in failed["exception"]
    worker.send(signal.SIGTERM)
    assert worker.wait(10) == 0, worker.stderr()


def test_a_drain_names_the_jids_it_pushed_back(r: redis.Redis,
                                               spawn: Callable[..., Worker]) -> None:  # noqa: F811
    jid, _ = push(r, "cli_slow", "long")
    worker = spawn("-r", "clijobs", "-t", "0.5", "--log-level", "info")
    wait_for(lambda: r.llen("cli:started") == 1 or worker.proc.poll() is not None)
    worker.send(signal.SIGTERM)
    assert worker.wait(10) == 0, worker.stderr()
    [requeued] = events_named(worker, "shutdown.requeued")
    assert (requeued["jobs"], requeued["jids"], requeued["pid"]) == (1, [jid], worker.proc.pid)


def test_launcher_started_comes_before_the_first_job_line(
        r: redis.Redis, spawn: Callable[..., Worker]) -> None:  # noqa: F811
    for i in range(5):
        push(r, "cli_echo", i)
    worker = spawn("-r", "clijobs", "--log-level", "debug", "-c", "5")
    wait_for(lambda: len(events_named(worker, "job.done")) == 5, what="five jobs done")
    names = [e.get("event") for e in worker.events()]
    assert names.index("launcher.started") < names.index("job.start")
    [listed] = events_named(worker, "launcher.jobs")
    assert {"cli_echo", "cli_slow"} <= set(listed["jobs"])
    assert not events_named(worker, "launcher.no_jobs")
    worker.send(signal.SIGTERM)
    assert worker.wait(10) == 0, worker.stderr()

