"""wurk.contrib.django with the sample project (examples/django_project), in real processes.

Every Django process is a subprocess: its settings, fork hooks and config
hook would otherwise reach the rest of the suite.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import redis
from django_project import PROJECT, Project, project, stop, unmigrated
from swarms import SwarmProcess, launch, slot
from waiting import wait_for

from supervisor.topology import TopologyError, parse

__all__ = ["launch", "project", "unmigrated"]

PLACE_ORDERS = """
import json
from django.db import transaction
from orders.jobs import fulfil_order
from orders.models import Order
ids = []
for item in {items!r}:
    with transaction.atomic():
        order = Order.objects.create(item=item)
        fulfil_order.perform_async(order.pk)
    ids.append(order.pk)
print(json.dumps(ids))
"""


def place(project: Project, *items: str) -> list[int]:
    ids: list[int] = project.python(PLACE_ORDERS.format(items=list(items)))[0]
    return ids


def wait_fulfilled(project: Project, ids: list[int], timeout: float = 30) -> list[tuple[int, int]]:
    def done() -> list[tuple[int, int]] | None:
        rows = project.fulfilled()
        return rows if {o for o, _ in rows} >= set(ids) else None

    found: list[tuple[int, int]] = wait_for(done, timeout=timeout, interval=0.1,
                                            what="fulfilment rows")
    return found


def test_manage_py_wurk_run_fulfils_orders_placed_in_transactions(
        project: Project, tmp_path: Path) -> None:
    ids = place(project, "book", "lamp", "desk")
    worker = project.start("manage.py", "wurk", "run", "-c", "2", log=tmp_path / "run.log")
    try:
        rows = wait_fulfilled(project, ids)
    finally:
        code = stop(worker)
    assert code == 0, (tmp_path / "run.log").read_text()[-2000:]
    assert sorted(o for o, _ in rows) == ids
    assert {pid for _, pid in rows} == {worker.pid}


def test_manage_py_wurk_swarm_boots_django_once_and_forks_children(
        project: Project, tmp_path: Path) -> None:
    ids = place(project, *(f"item-{i}" for i in range(8)))
    log = tmp_path / "swarm.log"
    parent = project.start("manage.py", "wurk", "swarm", "-t", "swarm.toml", log=log)
    try:
        rows = wait_fulfilled(project, ids)
    finally:
        code = stop(parent)
    text = log.read_text()
    assert code == 0, text[-2000:]
    assert sorted(o for o, _ in rows) == ids
    workers = {pid for _, pid in rows}
    assert parent.pid not in workers
    assert '"event": "swarm.forked"' in text and '"slot": "orders"' in text


def test_wurk_swarm_with_the_boot_module_runs_the_project(
        project: Project, launch: object, r: redis.Redis) -> None:
    ids = place(project, "one", "two", "three", "four")
    swarm: SwarmProcess = launch(  # type: ignore[operator]
        slot("orders", count=2, concurrency=2, queues=["orders"]),
        require=["wurk.contrib.django.boot"], env=project.env)
    rows = wait_fulfilled(project, ids)
    assert sorted(o for o, _ in rows) == ids
    assert swarm.pid not in {pid for _, pid in rows}
    swarm.send(15)
    assert swarm.wait_exit() == 0


def test_the_boot_module_names_the_missing_settings_variable(unmigrated: Project) -> None:
    env = {**unmigrated.env, "DJANGO_SETTINGS_MODULE": ""}
    done = unmigrated.run("-c", "import wurk.contrib.django.boot", check=False, env=env)
    assert done.returncode != 0
    assert "needs DJANGO_SETTINGS_MODULE" in done.stderr


BAD_SETTINGS = [
    ({"concurrency": 0}, "settings.WURK: concurrency must be from 1 to 1000, got 0"),
    ({"concurency": 4}, "settings.WURK: unknown key 'concurency' (set to 4)"),
    ({"queues": "orders"}, "settings.WURK: queues must be list"),
    ({"error_handlers": ["no.such.module.handler"]},
     "settings.WURK: error_handlers: cannot import 'no.such.module.handler'"),
    ({"error_handlers": "mysite.settings.WURK"}, "settings.WURK: error_handlers must be a list"),
    ({"on_redis_error": 3}, "settings.WURK: on_redis_error must hold callables"),
]

CHECK_EACH = textwrap.dedent("""
    import json
    from django.test import override_settings
    from django.conf import settings
    from wurk.contrib.django import conf
    from wurk.settings.config import ConfigError
    for change in json.loads({cases!r}):
        with override_settings(WURK=change if change == ["redis_url"] else
                               {{**settings.WURK, **change}}):
            try:
                conf.build_config()
                conf.hooks()
                print(json.dumps(None))
            except ConfigError as exc:
                print(json.dumps(str(exc)))
""")


def test_settings_wurk_is_checked_with_wurks_own_messages(unmigrated: Project) -> None:
    cases = [change for change, _ in BAD_SETTINGS] + [["redis_url"]]
    messages = unmigrated.python(CHECK_EACH.format(cases=json.dumps(cases)))
    wanted = [message for _, message in BAD_SETTINGS]
    wanted.append("settings.WURK must be a dict of wurk settings")
    for got, expected in zip(messages, wanted, strict=True):
        assert got is not None and expected in got


def test_a_bad_settings_wurk_stops_django_at_start(unmigrated: Project, tmp_path: Path) -> None:
    (tmp_path / "bad_settings.py").write_text(
        "from mysite.settings import *\nWURK = {**WURK, 'concurrency': 0}\n")
    env = {"DJANGO_SETTINGS_MODULE": "bad_settings",
           "PYTHONPATH": f"{tmp_path}:{unmigrated.env['PYTHONPATH']}"}
    done = unmigrated.manage("wurk", "run", check=False, env=env)
    assert done.returncode != 0
    assert "settings.WURK: concurrency must be" in done.stderr


def test_a_bad_flag_value_names_the_arguments_and_exits_78(unmigrated: Project) -> None:
    done = unmigrated.manage("wurk", "run", "-c", "0", check=False)
    assert done.returncode == 78
    assert "arguments: concurrency must be" in done.stderr


def test_swarm_topology_reads_over_settings_wurk(unmigrated: Project, tmp_path: Path) -> None:
    topology = tmp_path / "t.toml"
    topology.write_text('[wurk]\nshutdown_timeout = 3\n[[slot]]\nname = "a"\n')
    [layered] = unmigrated.python(textwrap.dedent("""
        import json, sys
        from supervisor.topology import load
        from wurk.contrib.django import conf
        t = load(sys.argv[1], defaults=conf.values(), defaults_source=conf.SOURCE)
        print(json.dumps([t.base.concurrency, t.base.shutdown_timeout, t.base.queues]))
        """).replace("sys.argv[1]", repr(str(topology))))
    # settings.WURK's concurrency and queues, the file's shutdown_timeout over its 5.
    assert layered == [4, 3.0, ["orders", "default"]]
    topology.write_text('[[slot]]\nname = "a"\nconcurrency = 0\n')
    done = unmigrated.manage("wurk", "swarm", "-t", str(topology), check=False)
    assert done.returncode == 78
    assert "slot 'a'" in done.stderr and "concurrency" in done.stderr
    good = unmigrated.manage("wurk", "swarm", "-t", str(PROJECT / "swarm.toml"), "--check")
    assert "is valid over settings.WURK (2 children)" in good.stdout


def test_a_bad_value_from_settings_wurk_is_named_in_a_topology_error(tmp_path: Path) -> None:
    document = {"slot": [{"name": "a"}]}
    with pytest.raises(TopologyError, match=r"settings\.WURK: concurrency must be"):
        parse(document, tmp_path / "t.toml", env={}, defaults={"concurrency": 0},
              defaults_source="settings.WURK")
    with pytest.raises(TopologyError, match=r"settings\.WURK: unknown key 'bogus'"):
        parse(document, tmp_path / "t.toml", env={}, defaults={"bogus": 1},
              defaults_source="settings.WURK")
