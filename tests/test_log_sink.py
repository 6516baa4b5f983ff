"""The entry point's log sink: batched info lines, whole, ordered, and flushed.

Real processes write through ``wurk.core.logging`` to a file or a pipe, and
the tests read what arrived: many threads, a fork sharing the pipe, a clean
exit, a crash, ``os._exit`` and SIGKILL. In-process tests check that the
fast path writes the very line structlog's chain would, and yields to
``capture_logs`` and to an application's own structlog configuration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs
from waiting import wait_for

from wurk.core import logging as wlog
from wurk.core.logsink import CHUNK, LineSink

PRELUDE = """
import os, sys, threading
from wurk.core import logging as wlog
wlog.setup("info", "json")
log = wlog.get_logger("wurk.test")
"""


def run_script(body: str, stderr: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=stderr, **kwargs)


def lines_of(path: Path) -> list[dict[str, Any]]:
    """Every line of the file as JSON: a torn or merged line fails the parse."""
    return [json.loads(line) for line in path.read_bytes().decode().splitlines()]


def events(lines: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["event"] == name]


def test_lines_from_many_threads_arrive_whole_each_once_in_each_threads_order(
        tmp_path: Path) -> None:
    out = tmp_path / "err.log"
    with out.open("wb") as err:
        proc = run_script("""
            def work(n):
                for i in range(500):
                    log.info("t.line", thread=n, seq=i, pad="x" * (i % 300))
                    if i % 97 == 0:
                        log.warning("t.loud", thread=n, seq=i)
            threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
            for t in threads: t.start()
            for t in threads: t.join()
            """, err)
        assert proc.wait(60) == 0
    lines = lines_of(out)
    for n in range(8):
        seqs = [line["seq"] for line in events(lines, "t.line") if line["thread"] == n]
        assert seqs == list(range(500))
        # A warning is written after every info line its thread logged before it.
        for loud in (line for line in events(lines, "t.loud") if line["thread"] == n):
            index = lines.index(loud)
            before = [line["seq"] for line in lines[:index]
                      if line["event"] == "t.line" and line["thread"] == n]
            assert before and before[-1] == loud["seq"]


def test_a_parent_and_its_forked_child_share_a_pipe_without_tearing_a_line(
        tmp_path: Path) -> None:
    read_fd, write_fd = os.pipe()
    proc = run_script("""
        log.info("f.pending", who="parent-before-fork")  # pending when the fork comes
        pid = os.fork()
        who = "child" if pid == 0 else "parent"
        for i in range(3000):
            log.info("f.line", who=who, seq=i, pad="y" * 700)
        if pid == 0:
            wlog.flush()
            os._exit(0)
        os.waitpid(pid, 0)
        """, write_fd, pass_fds=(write_fd,))
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as reader:
        data = reader.read()
    assert proc.wait(60) == 0
    lines = [json.loads(line) for line in data.decode().splitlines()]
    # Written once, by the parent before the fork, never copied into the child.
    assert len(events(lines, "f.pending")) == 1
    for who in ("parent", "child"):
        assert [x["seq"] for x in events(lines, "f.line") if x["who"] == who] == list(range(3000))


@pytest.mark.parametrize("ending", [
    "sys.exit(0)",
    "raise RuntimeError('crash after logging')",
    "wlog.flush(); os._exit(3)",
])
def test_every_line_logged_before_an_exit_or_a_crash_is_written(tmp_path: Path,
                                                              ending: str) -> None:
    out = tmp_path / "err.log"
    with out.open("wb") as err:
        proc = run_script(f"""
            for i in range(2000):
                log.info("e.line", seq=i)
            {ending}
            """, err)
        proc.wait(60)
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
    assert [line["seq"] for line in events(lines, "e.line")] == list(range(2000))


def test_a_sigkill_loses_no_warning_and_no_line_logged_before_it(tmp_path: Path) -> None:
    out = tmp_path / "err.log"
    with out.open("wb") as err:
        proc = run_script("""
            for i in range(300):
                log.info("k.line", seq=i)
            log.error("k.loud")
            os.kill(os.getpid(), 9)
            """, err)
        assert proc.wait(60) == -signal.SIGKILL
    assert [line["event"] for line in lines_of(out)] == ["k.line"] * 300 + ["k.loud"]


def test_the_flusher_writes_a_quiet_process_lines_without_more_logging(tmp_path: Path) -> None:
    out = tmp_path / "err.log"
    with out.open("wb") as err:
        proc = run_script("""
            for i in range(50):
                log.info("q.line", seq=i)
            threading.Event().wait(60)
            """, err)
        try:
            wait_for(lambda: out.read_bytes().count(b"\n") == 50, timeout=20,
                     what="the pending lines flushed by the flusher thread")
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(10)
    assert [line["seq"] for line in lines_of(out)] == list(range(50))


class RecordingSink(LineSink):
    """Keeps each write's bytes instead of writing them; no flusher thread;
    a clock that moves only when told to."""

    def __init__(self, max_pending: int = 10**9, burst: int = 2) -> None:
        self.now = 1000.0
        super().__init__(fd=-1, interval=0.1, max_pending=max_pending, burst=burst,
                         clock=lambda: self.now)
        self.writes: list[bytes] = []

    def _put(self, data: bytes) -> None:
        self.writes.append(data)

    def _ensure_flusher(self) -> None:
        pass


def test_a_few_lines_are_written_at_once_a_stream_is_batched() -> None:
    sink = RecordingSink(max_pending=100, burst=2)
    sink.write(b"first\n")
    sink.write(b"second\n")
    assert sink.writes == [b"first\n", b"second\n"]  # within the burst: at once
    sink.now += 0.05
    sink.write(b"third\n")
    sink.write(b"fourth\n")
    assert sink.pending() == 2 and len(sink.writes) == 2  # a stream: batched
    sink.now += 1.0  # a new interval, but lines are pending: they keep their order
    sink.write(b"fifth\n")
    assert sink.pending() == 3
    sink.write(b"x" * 100 + b"\n")  # past max_pending: the writer flushes
    assert sink.pending() == 0
    assert b"".join(sink.writes) == (b"first\nsecond\nthird\nfourth\nfifth\n"
                                     + b"x" * 100 + b"\n")
    sink.now += 1.0
    sink.write(b"quiet again\n")
    assert sink.writes[-1] == b"quiet again\n"


def test_chunks_hold_whole_lines_of_at_most_pipe_buf_bytes() -> None:
    sink = RecordingSink(burst=0)
    lines = [(f"{i}:" + "z" * (i * 37 % 900)).encode() + b"\n" for i in range(200)]
    lines.append(b"L" * (CHUNK * 2) + b"\n")  # longer than a chunk: written alone
    lines.append(b"after\n")
    for line in lines:
        sink.write(line)
    assert sink.pending() == len(lines) and not sink.writes
    sink.write(b"loud\n", urgent=True)  # writes what is pending first, then itself
    assert sink.pending() == 0
    assert b"".join(sink.writes) == b"".join(lines) + b"loud\n"
    assert sink.writes[-1] == b"loud\n" and b"L" * (CHUNK * 2) + b"\n" in sink.writes
    for data in sink.writes:
        assert data.endswith(b"\n")
        assert len(data) <= CHUNK or data.count(b"\n") == 1
    assert len(sink.writes) < len(lines) / 5  # batched, not one write per line


class Interrupted(BaseException):
    """Stands in for a JobTimeout landing in the thread that is flushing."""


def test_an_exception_in_the_middle_of_a_flush_loses_no_line() -> None:
    sink = RecordingSink(burst=0)
    lines = [f"{i}:".encode() + b"y" * 1000 + b"\n" for i in range(12)]  # several chunks
    for line in lines:
        sink.write(line)
    put = sink._put
    calls = 0

    def put_then_interrupted(data: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise Interrupted
        put(data)

    sink._put = put_then_interrupted  # type: ignore[method-assign]
    with pytest.raises(Interrupted):
        sink.flush()
    assert len(sink.writes) == 1 and 0 < sink.pending() < len(lines)
    sink._put = put  # type: ignore[method-assign]
    sink.flush()
    assert b"".join(sink.writes) == b"".join(lines)  # each line once, in order


def test_the_fast_path_writes_the_line_structlogs_chain_writes(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    log = wlog.get_logger("wurk.test")
    fields = {"jid": "abc", "class": "J", "queue": "q", "tid": "t1", "elapsed": 0.25,
              "url": "redis://u:hunter2@h/0", "obj": object, "n": None}
    with structlog.contextvars.bound_contextvars(request="r1"):
        log.info("same.line", **fields)
        # exc_info=None sends the event through structlog's own chain.
        log.info("same.line", exc_info=None, **fields)
    wlog.flush()
    fast, slow = (json.loads(line) for line in capfd.readouterr().err.splitlines())
    assert list(fast) == list(slow)
    assert {**fast, "timestamp": ""} == {**slow, "timestamp": ""}
    assert fast["url"] == "redis://u:***@h/0" and fast["request"] == "r1"
    assert fast["level"] == "info" and fast["pid"] == os.getpid()


def test_capture_logs_and_an_applications_configuration_take_the_events(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    log = wlog.get_logger("wurk.test")
    with capture_logs() as captured:
        log.info("job.done", jid="j1")
        log.debug("quiet.here")  # below the threshold setup() set
    assert captured == [{"event": "job.done", "jid": "j1", "log_level": "info"}]
    seen: list[str] = []
    structlog.configure(processors=[lambda _l, _m, e: seen.append(e["event"]) or "x"])
    log.info("theirs")
    assert seen == ["theirs"]
    wlog.setup("info", "json")
    log.info("ours.again")
    wlog.flush()
    err = capfd.readouterr().err
    assert '"event": "ours.again"' in err and "job.done" not in err


def test_the_timestamp_is_iso_utc_with_microseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    for nanos, text in ((0, "1970-01-01T00:00:00.000000Z"),
                        (1_767_322_745_123_456_789, "2026-01-02T02:59:05.123456Z"),
                        (1_767_322_745_999_999_999, "2026-01-02T02:59:05.999999Z"),
                        (1_767_322_746_000_001_000, "2026-01-02T02:59:06.000001Z")):
        monkeypatch.setattr(time, "time_ns", lambda n=nanos: n)
        assert wlog.add_timestamp(None, "info", {})["timestamp"] == text
