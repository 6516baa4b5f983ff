"""A recovered job a person deletes or kills takes its poison-pill marks along:
its suspect mark and its pill counter go in the removal's own script
(wurk.api.removal), from the API, ``wurk`` and the dashboard alike, rather
than living on until their TTLs. Real Redis; the crashed processes are faked
by writing what they leave behind (tests/fetching.py)."""

from __future__ import annotations

import time

import admin_cli
import redis
from admin_cli import Cli
from fetching import fake_dead_owner, jid_of, payload
from starlette.testclient import TestClient

import wurk.web
from wurk.api import Queue
from wurk.redis.runtime import runtime_for
from wurk.runtime.reaper import crashed, recover
from wurk.settings.config import Config
from wurk.wire import keys

cli = admin_cli.cli
keep_logging = admin_cli.keep_logging
SEGV = crashed("killed by SIGSEGV")


def suspects(rb: redis.Redis) -> list[bytes]:
    return sorted(rb.zrange(keys.SUSPECTS, 0, -1))


def recovered(config: Config, rb: redis.Redis, *raws: bytes) -> None:
    """``raws`` were running in a process that crashed: each a suspect now, and
    a lone one blamed once (its pill counter at 1)."""
    identity = f"crashed:{len(raws)}:{time.time_ns() % 10**12:012d}"
    fake_dead_owner(rb, identity, "default", *raws)
    assert recover(runtime_for(config), identity, cause=SEGV) == (len(raws), 0)


def test_deleting_a_recovered_job_drops_its_suspect_mark_and_pill(
        config: Config, rb: redis.Redis) -> None:
    company = [payload("Any", n) for n in range(3)]
    recovered(config, rb, *company)
    lone = payload("Lone", 1)
    recovered(config, rb, lone)
    assert suspects(rb) == sorted([*company, lone]) and rb.get(keys.pill(jid_of(lone))) == b"1"
    queue = Queue("default", config=config)
    deleted = queue.find_job(jid_of(company[0]))
    assert deleted is not None and deleted.delete()
    assert suspects(rb) == sorted([*company[1:], lone])
    gone = queue.find_job(jid_of(lone))
    assert gone is not None and gone.delete()
    assert suspects(rb) == sorted(company[1:]) and not rb.exists(keys.pill(jid_of(lone)))
    assert queue.clear() == 2
    assert not rb.exists(keys.SUSPECTS)


def test_a_poison_pill_deleted_from_dead_by_the_cli_or_cleared_by_the_dashboard_loses_its_marks(
        cli: Cli, config: Config, rb: redis.Redis) -> None:
    buried = payload("Buried", 1)
    rb.set(keys.pill(jid_of(buried)), 4, ex=keys.PILL_TTL)  # as the reaper leaves a pill it buried
    rb.zadd(keys.DEAD, {buried: time.time()})
    done = cli("dead", "delete", jid_of(buried), "--yes")
    assert done.code == 0, done.err
    assert rb.zcard(keys.DEAD) == 0 and not rb.exists(keys.pill(jid_of(buried)))
    jobs = [payload("Any", n) for n in range(2)]
    recovered(config, rb, *jobs)
    lone = payload("Lone", 2)
    recovered(config, rb, lone)
    with TestClient(wurk.web.app(config)) as web:
        page = web.get("/queues")
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        web.post("/queues/default/clear", data={"csrf": csrf, "confirm": "default"})
    assert rb.llen("queue:default") == 0
    assert not rb.exists(keys.SUSPECTS) and not rb.exists(keys.pill(jid_of(lone)))
