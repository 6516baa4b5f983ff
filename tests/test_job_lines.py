"""A job's start and done lines: the shortcut writes the chain's very bytes.

:mod:`wurk.core.joblog` renders a job's fields once and writes its
``job.start`` and ``job.done`` lines without structlog's chain. These tests
write the same events both ways in one process and compare the lines, and
check every case where the shortcut must step aside (a URL to redact, values
bound in contextvars, an application's own configuration, info off).
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from wurk.core import joblog
from wurk.core import logging as wlog

CONTEXT = {"jid": "0123456789abcdef01234567", "class": "Mod::Jöb", "queue": "q\"1",
           "tid": "abc"}


def lines_both_ways(context: dict[str, Any], capfd: pytest.CaptureFixture[str],
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    log = wlog.get_logger("wurk.test")
    lines = joblog.job_lines(log, dict(context))
    assert lines is not None
    lines.start()
    lines.done(0.000125)
    # exc_info=None sends an event through structlog's own chain.
    log.info("job.start", exc_info=None, **context)
    log.info("job.done", exc_info=None, **context, elapsed=0.000125)
    wlog.flush()
    err = capfd.readouterr().err
    parsed = [json.loads(line) for line in err.splitlines()]
    assert len(parsed) == 4, err
    return parsed[:2], parsed[2:], err


def test_the_lines_are_the_chains_lines_key_order_included(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    wlog.bind_process(slot="default", index=1)
    ours, chain, _ = lines_both_ways(CONTEXT, capfd)
    for mine, theirs in zip(ours, chain, strict=True):
        assert list(mine) == list(theirs)
        assert {**mine, "timestamp": ""} == {**theirs, "timestamp": ""}
    start, done = ours
    assert start["event"] == "job.start" and done["event"] == "job.done"
    assert done["elapsed"] == 0.000125 and done["class"] == "Mod::Jöb"
    assert start["pid"] == os.getpid() and start["slot"] == "default" and start["index"] == 1


def test_a_jid_that_is_not_a_string_is_rendered_as_the_chain_renders_it(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    ours, chain, _ = lines_both_ways({**CONTEXT, "jid": None, "tid": "\u2028\x00"}, capfd)
    assert ours[0]["jid"] is None and ours[0]["tid"] == "\u2028\x00"
    assert [list(line) for line in ours] == [list(line) for line in chain]


def test_a_change_of_process_fields_shows_in_the_next_line(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    lines_both_ways(CONTEXT, capfd)
    wlog.bind_process(index=7)
    ours, _, _ = lines_both_ways(CONTEXT, capfd)
    assert ours[0]["index"] == 7 and ours[1]["index"] == 7


def test_a_url_in_a_class_name_is_redacted(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    ours, chain, err = lines_both_ways({**CONTEXT, "class": "redis://u:hunter2@h/0"}, capfd)
    assert "hunter2" not in err
    assert ours[0]["class"] == chain[0]["class"] == "redis://u:***@h/0"


def test_values_bound_in_contextvars_are_carried(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    with structlog.contextvars.bound_contextvars(request="r1"):
        ours, chain, _ = lines_both_ways(CONTEXT, capfd)
    assert ours[0]["request"] == ours[1]["request"] == "r1"
    assert [list(line) for line in ours] == [list(line) for line in chain]


def test_values_the_job_binds_while_it_runs_are_in_its_done_line(
        our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    log = wlog.get_logger("wurk.test")
    lines = joblog.job_lines(log, dict(CONTEXT))
    assert isinstance(lines, joblog._FastLines)  # nothing bound when the job starts
    lines.start()
    with structlog.contextvars.bound_contextvars(request="r2"):  # as the job would
        lines.done(0.25)
        log.info("job.done", exc_info=None, **CONTEXT, elapsed=0.25)  # the chain's line
    wlog.flush()
    start, done, chain = [json.loads(line) for line in capfd.readouterr().err.splitlines()]
    assert "request" not in start
    assert done["request"] == "r2" and done["elapsed"] == 0.25
    assert {**done, "timestamp": ""} == {**chain, "timestamp": ""}


def test_capture_logs_sees_both_events(our_pipeline: None) -> None:
    log = wlog.get_logger("wurk.test")
    with capture_logs() as captured:
        lines = joblog.job_lines(log, dict(CONTEXT))
        assert lines is not None
        lines.start()
        lines.done(0.5)
    assert [e["event"] for e in captured] == ["job.start", "job.done"]
    assert captured[1]["elapsed"] == 0.5 and captured[1]["jid"] == CONTEXT["jid"]


def test_nothing_at_warning_level(our_pipeline: None, capfd: pytest.CaptureFixture[str]) -> None:
    wlog.setup("warning", "json")
    assert joblog.job_lines(wlog.get_logger("wurk.test"), dict(CONTEXT)) is None
    wlog.flush()
    assert capfd.readouterr().err == ""
