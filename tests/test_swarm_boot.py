"""``wurk-swarm`` boot: slots come up and take jobs; a slot or a preload that
cannot boot ends the swarm cleanly; forking is safe while the parent logs hard;
a swarm hosted in an ASGI app boots and drains with it.

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py).
"""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest
import redis
import swarms
from swarms import Launch, gone, push, slot
from waiting import wait_for

from supervisor.exits import EX_BOOT

pytestmark = pytest.mark.timeout(60)

launch = swarms.launch


def test_two_slots_boot_their_children_and_jobs_flow_through_them(
        launch: Launch, r: redis.Redis) -> None:
    swarm = launch(slot("alpha", count=2, concurrency=2, queues=["qa"]),
                   slot("beta", concurrency=3, queues=["qb", "qc"]),
                   layout={"alpha": 2, "beta": 1})
    ready = swarm.wait_ready()

    assert swarm.child_pids() == {info["pid"] for info in ready.values()}
    for index in (0, 1):
        info = ready[("alpha", index)]
        assert (info["concurrency"], info["queues"]) == (2, ["qa"])
        assert info["hash"]["concurrency"] == "2"
    beta = ready[("beta", 0)]
    assert (beta["concurrency"], beta["queues"]) == (3, ["qb", "qc"])
    forked = swarm.wait_events("swarm.forked")[0]
    booted = swarm.wait_events("swarm.booted")[0]
    assert forked["children"] == 3 and booted["ready"] == 3
    names = [e["event"] for e in swarm.events()]
    # Booted means every child is ready, so it comes after the last child.ready.
    assert names.index("swarm.booted") > max(i for i, n in enumerate(names) if n == "child.ready")

    for n in range(10):
        push(r, "qa", "record", f"a{n}")
    for n in range(5):
        push(r, "qb" if n % 2 else "qc", "record", f"b{n}")
    done = wait_for(lambda: (d := r.lrange("done", 0, -1)) and len(d) >= 15 and d,
                    what="15 jobs done")
    alpha_pids = {ready[("alpha", i)]["pid"] for i in (0, 1)}
    for entry in done:
        tag, pid = entry.split(":")
        assert int(pid) in (alpha_pids if tag.startswith("a") else {beta["pid"]}), entry
    assert sorted(e.split(":")[0] for e in done) == sorted(
        [f"a{n}" for n in range(10)] + [f"b{n}" for n in range(5)])

    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_boot_failing_after_some_forks_gives_up_and_leaves_no_child(
        launch: Launch, tmp_path: Path) -> None:
    (tmp_path / "module_that_raises.py").write_text(
        "raise RuntimeError('this slot cannot boot')\n", encoding="utf-8")
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("broken", concurrency=1, queues=["qb"],
                        require=["swarm_jobs", "module_that_raises"]),
                   boot_failure_limit=2, shutdown_timeout=1)
    code = swarm.wait_exit(30)
    assert code != 0
    giving_up = swarm.events("swarm.giving_up")
    assert giving_up and giving_up[0]["slot"] == "broken"
    failures = swarm.events("child.boot_failed", slot="broken")
    assert any("this slot cannot boot" in str(e.get("error")) for e in failures)
    spawned = swarm.events("child.spawned")
    assert {e["slot"] for e in spawned} == {"alpha", "broken"}
    assert all(gone(e["pid"]) for e in spawned)
    assert swarm.events("swarm.drained")


@pytest.mark.parametrize("module", [
    None,
    "import sys\nsys.exit(4)\n",
], ids=["missing-module", "sys-exit-at-import"])
def test_preload_failure_in_the_parent_forks_nothing(launch: Launch, tmp_path: Path,
                                                     module: str | None) -> None:
    if module is not None:
        (tmp_path / "bad_preload.py").write_text(module, encoding="utf-8")
    swarm = launch(slot("alpha", queues=["qa"]),
                   require=["bad_preload" if module else "no_such_module_anywhere"])
    assert swarm.wait_exit(30) == EX_BOOT  # promptly: never a hang
    failed = swarm.events("swarm.boot_failed")
    assert failed
    assert ("SystemExit" if module else "ModuleNotFoundError") in failed[0]["error"]
    assert not swarm.events("child.spawned")


SPAMMY_PARENT = textwrap.dedent("""
    import sys
    import threading

    from supervisor.cli import run
    from supervisor.swarm import Swarm
    from supervisor.topology import load
    from wurk.core import logging as wlog

    topology = load(sys.argv[1])
    wlog.setup(topology.base.log_level, topology.base.log_format)
    log = wlog.get_logger("test.spam")


    def spam():
        n = 0
        while True:
            log.info("spam", n=n, pad="x" * 64)
            n += 1


    threading.Thread(target=spam, daemon=True).start()
    sys.exit(run(Swarm(topology)))
""")


def test_forking_while_the_parent_logs_heavily_does_not_deadlock(
        launch: Launch, tmp_path: Path) -> None:
    script = tmp_path / "spammy_parent.py"
    script.write_text(SPAMMY_PARENT, encoding="utf-8")
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", count=2, concurrency=1, queues=["qb"]),
                   script=script, layout={"alpha": 2, "beta": 2})
    swarm.wait_ready(timeout=20)
    # One signal at a time: the kernel merges a signal sent while one is pending.
    swarm.send(signal.SIGTTIN)
    swarm.wait_ready({"alpha": 3, "beta": 3}, timeout=20)
    swarm.send(signal.SIGTTIN)
    grown = swarm.wait_ready({"alpha": 4, "beta": 4}, timeout=20)
    victims = {grown[("alpha", 3)]["pid"], grown[("beta", 0)]["pid"]}
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    swarm.wait_ready({"alpha": 4, "beta": 4}, timeout=20, not_pids=victims)
    size = swarm.log_path.stat().st_size
    assert size > 1_000_000  # the parent really was logging hard all along

    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit(20) == 0
    swarm.log_path.unlink()  # tens of megabytes of spam


HOSTED_SCRIPT = textwrap.dedent("""
    import asyncio, json, os, sys, time
    import redis
    os.environ["WURK_TOPOLOGY"] = sys.argv[1]
    import wurk.core.logging
    wurk.core.logging.setup("info", "json")  # the host configures logging, as an app would
    from examples import asgi_app

    async def lifespan():
        messages = asyncio.Queue()
        sent = []
        async def receive():
            return await messages.get()
        async def send(message):
            sent.append(message["type"])
        task = asyncio.ensure_future(asgi_app.app({"type": "lifespan"}, receive, send))
        await messages.put({"type": "lifespan.startup"})
        r = redis.Redis.from_url(os.environ["TEST_REDIS_URL"], decode_responses=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            infos = [r.hget(i, "info") for i in r.smembers("processes")]
            # Both children: one TERMed before it is ready exits without starting.
            if sum(1 for i in infos if i and json.loads(i).get("swarm_pid") == os.getpid()) >= 2:
                break
            await asyncio.sleep(0.1)
        print(json.dumps({"event": "hosted.ready", "children": len(infos)}), flush=True)
        hosted = asgi_app.workers.runner
        await messages.put({"type": "lifespan.shutdown"})
        await task
        print(json.dumps({"event": "hosted.done", "sent": sent,
                          "exit_code": hosted.swarm.exit_code,
                          "children_left": len(hosted.swarm.children)}), flush=True)

    asyncio.run(lifespan())
""")


def test_hosted_swarm_in_an_asgi_app_boots_and_drains_with_the_app(
        launch: Launch, tmp_path: Path, r: redis.Redis) -> None:
    script = tmp_path / "hosted.py"
    script.write_text(HOSTED_SCRIPT, encoding="utf-8")
    swarm = launch(slot("alpha", count=2, queues=["qa"]), script=script,
                   layout={"alpha": 2})
    assert swarm.wait_exit(30) == 0
    done = swarm.wait_events("hosted.done")[0]
    assert done["sent"] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert done["exit_code"] == 0 and done["children_left"] == 0
    assert len(swarm.events("child.ready")) == 2
    assert r.smembers("processes") == set()


SLOT_HOOK = textwrap.dedent("""
    import dataclasses

    from wurk.settings.config import when_configured


    def _hook(config):
        # A field an integration cannot extend in place comes back in a copy.
        return dataclasses.replace(config, queues=["hooked"])


    when_configured(_hook)
""")


def test_a_child_works_the_copy_its_slots_own_require_had_installed(
        launch: Launch, tmp_path: Path, r: redis.Redis) -> None:
    # Loaded in the child only, after its config was installed (a slot's own
    # wurk.contrib.django.boot does this): the callback's copy is what it runs.
    (tmp_path / "slot_hook.py").write_text(SLOT_HOOK, encoding="utf-8")
    swarm = launch(slot("alpha", queues=["qa"], require=["swarm_jobs", "slot_hook"]))
    swarm.wait_ready({"alpha": 1})
    push(r, "hooked", "record", "from the hooked queue")
    wait_for(lambda: r.llen("done") == 1, what="the job of the copy's queue ran")
    assert r.lrange("done", 0, -1)[0].startswith("from the hooked queue:")
