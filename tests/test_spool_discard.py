"""``wurk spool discard`` (and the dashboard's Discard) end the jobs of the
files they delete with what their push took: a unique job's lock, a batch
member's count, as a delete of a queued job does (wurk.api.removal). A job
whose push landed after all keeps what it holds. Real redis-server; the
spool is written by a real buffered client's exit path."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import admin_cli
import pytest
import redis
from conftest import RedisServer
from starlette.testclient import TestClient
from waiting import wait_for

import wurk
import wurk.web
from wurk.admin import spool as admin_spool
from wurk.api.removal import discard_spooled
from wurk.cli import main
from wurk.core.backoff import Backoff
from wurk.push import buffered, spool
from wurk.push.client import Client
from wurk.redis.runtime import close_runtime, runtime_for
from wurk.results import records as results
from wurk.settings.config import Config
from wurk.unique.keys import lock_key
from wurk.wire import keys

pytestmark = pytest.mark.timeout(90)
keep_logging = admin_cli.keep_logging
Capsys = pytest.CaptureFixture[str]


def noreplicas(r: redis.Redis) -> int:
    return int(r.info("errorstats").get("errorstat_NOREPLICAS", {}).get("count", 0))


@pytest.fixture
def spooling(own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    """A buffered client whose drainer, once it failed, waits a minute: the
    test decides when Redis takes writes, and nothing sends meanwhile."""
    monkeypatch.setattr(buffered, "DRAIN_BACKOFF", Backoff(first=60.0, cap=60.0))
    client = Client(Config(redis_url=own_redis.url, log_level="warning",
                           push_flush_timeout=0.2), drain_spool=False)
    yield client
    close_runtime(client.config)


def spool_while_writes_are_refused(r: redis.Redis, client: Client,
                                   pushes: Callable[[], Any]) -> Any:
    """What ``pushes`` pushes lands in the spool with what its steps took, as
    when Redis refuses writes (a failover's NOREPLICAS) around the pushes:
    the first push waits in the buffer, the next ones queue behind it, and
    the exit path spools them all."""
    r.config_set("min-replicas-to-write", 1)
    seen = noreplicas(r)
    assert client.push({"class": "Lead", "args": [0]}) is not None  # kept: NOREPLICAS
    wait_for(lambda: noreplicas(r) >= seen + 4, timeout=20,
             what="the drainer's first send refused too (then it waits a minute)")
    r.config_set("min-replicas-to-write", 0)
    made = pushes()  # their steps take locks and counts; their writes wait behind
    r.config_set("min-replicas-to-write", 1)
    assert client.buffer is not None
    client.buffer.flush_at_exit()  # the exit path: not flushed in time, so spooled
    r.config_set("min-replicas-to-write", 0)
    return made


def discard_all(url: str, capsys: Capsys) -> dict[str, Any]:
    capsys.readouterr()
    code = main(["--redis-url", url, "spool", "discard", "--all", "--yes", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_discarding_spooled_jobs_gives_back_their_locks_and_batch_counts(
        own_redis: RedisServer, spooling: Client, define: Callable[..., Any],
        capsys: Capsys) -> None:
    r = own_redis.client()

    def noop(*args: Any) -> None:
        pass

    job = define(noop)

    def pushes() -> tuple[str, str | None]:
        assert spooling.push({"class": "Once", "args": [1], "unique_for": 3600}) is not None
        with wurk.Batch("spooled", client=spooling, on_complete=(job, [])) as batch:
            member = batch.add(job, 1)
        return batch.bid, member

    bid, member = spool_while_writes_are_refused(r, spooling, pushes)
    lock = lock_key("Once", "default", [1])
    assert r.exists(lock) and r.hget(f"b-{bid}", "pending") == "1"
    [name] = spool.spool_files(spool.spool_dir(spooling.config))
    with name.path.open("rb") as fh:
        header = spool.read_header(fh)
        jobs = [(entry.nonce, entry.job) for entry in spool.read_entries(fh, header)]
    assert r.llen("queue:default") == 0
    doc = discard_all(own_redis.url, capsys)
    assert not name.path.exists()
    assert not r.exists(lock)
    assert Client(Config(redis_url=own_redis.url, log_level="warning")).push(
        {"class": "Once", "args": [1], "unique_for": 3600}) is not None
    assert r.exists(f"b-{bid}-complete") and r.scard(f"b-{bid}-died") == 1
    assert r.hget(f"b-{bid}", "failures") == "1"
    info = json.loads(r.hget(f"b-{bid}-failinfo", str(member)))
    assert info["class"] == "JobDeletedError" and "the spool" in info["message"]
    [done] = doc["discarded"]
    assert done["jobs"] == 3 and done["released"] == 2  # the lead job held nothing
    # Replayed (a lost reply, a copy of the file) it ends nothing twice.
    assert discard_spooled(runtime_for(Config(redis_url=own_redis.url)), jobs) == 0
    assert r.hget(f"b-{bid}", "failures") == "1"


def spooled_unique(r: redis.Redis, n: int) -> tuple[spool.SpoolEntry, str]:
    """A unique job's spool line, its lock taken as its push's step took it."""
    jid, lock = os.urandom(12).hex(), lock_key("Once", "default", [n])
    job = json.dumps({"class": "Once", "args": [n], "queue": "default", "jid": jid,
                      "unique_for": 3600, "unique_lock": lock, "created_at": time.time()})
    r.set(lock, jid, ex=3600)
    return spool.SpoolEntry(os.urandom(8).hex(), jid, "default", None, job), jid


def test_a_job_whose_push_landed_keeps_its_lock_and_the_dashboard_discards_too(
        config: Config, r: redis.Redis) -> None:
    landed, landed_jid = spooled_unique(r, 1)
    lost, _ = spooled_unique(r, 2)
    # The first push did land (its marker holds its nonce, its job waits in its queue).
    r.set(keys.pushed(landed_jid), landed.nonce, ex=keys.PUSHED_TTL)
    r.lpush("queue:default", landed.job)
    path = spool.write_spool(spool.spool_dir(config), spool.target_of(config), [landed, lost])
    with TestClient(wurk.web.app(config)) as web:
        page = web.get("/spool")
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        answer = web.post("/spool/discard", data={"csrf": csrf, "file": path.name})
        assert answer.status_code in (200, 303)
    assert not path.exists()
    assert r.get(lock_key("Once", "default", [1])) == landed_jid  # its job is queued
    assert not r.exists(lock_key("Once", "default", [2]))
    assert r.llen("queue:default") == 1


def test_a_file_whose_redis_cannot_be_told_is_kept_for_a_later_discard(
        capsys: Capsys) -> None:
    config = Config(redis_url="redis://127.0.0.1:9/0")  # nobody listens there
    entry = spool.SpoolEntry(os.urandom(8).hex(), "a" * 24, "default", None, json.dumps(
        {"class": "Once", "args": [1], "queue": "default", "jid": "a" * 24,
         "unique_for": 3600}))
    path = spool.write_spool(spool.spool_dir(config), spool.target_of(config), [entry])
    capsys.readouterr()
    code = main(["--redis-url", config.redis_url, "spool", "discard", "--all", "--yes"])
    err = capsys.readouterr().err
    assert code == 1 and path.name in err
    [left] = spool.spool_files(path.parent)
    assert left.path == path and left.state == "waiting"  # given back under its own name


def spooled_result(n: int) -> tuple[spool.SpoolEntry, str]:
    """A spool line of a job that asked for its result."""
    jid = os.urandom(12).hex()
    job = json.dumps({"class": "Kept", "args": [n], "queue": "default", "jid": jid,
                      "result_ttl": 600, "created_at": time.time()})
    return spool.SpoolEntry(os.urandom(8).hex(), jid, "default", None, job), jid


def test_a_spooled_job_that_ran_after_its_marker_expired_keeps_its_result(
        config: Config, r: redis.Redis) -> None:
    ran, ran_jid = spooled_result(1)
    lost, lost_jid = spooled_result(2)
    # The first push landed and its job ran: its record is its own, and its
    # push marker has expired (more than PUSHED_TTL went by), so nothing here
    # says the push landed.
    own = json.dumps({"status": "success", "value": 42, "final": True})
    r.set(results.key(ran_jid), own, ex=600)
    path = spool.write_spool(spool.spool_dir(config), spool.target_of(config), [ran, lost])
    [name] = spool.spool_files(spool.spool_dir(config))
    held = spool.claim(name)
    assert held is not None
    admin_spool.discard_file(runtime_for(config), held)
    assert not path.exists()
    assert r.get(results.key(ran_jid)) == own
    record = json.loads(r.get(results.key(lost_jid)))
    assert record["status"] == "failed" and record["error"]["final"]
