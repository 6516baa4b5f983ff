"""Database connections across fork and around jobs, and pushes that wait for a commit.

Each check runs as a script in a subprocess with the sample project's
settings (Django's hooks must not reach the rest of the suite); the script
prints JSON lines that the test reads.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
import redis
from conftest import free_port
from django_project import Project, project, unmigrated

__all__ = ["project", "unmigrated"]

FORK = textwrap.dedent("""
    import json, os
    from django.db import connection, transaction
    from orders.models import Order

    def fork_and_report(label):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            inherited = connection.connection is not None
            atomic = connection.in_atomic_block
            # A read on a connection of its own (the parent may hold SQLite's write lock).
            count = Order.objects.filter(item__startswith="warm").count()
            report = {"inherited": inherited, "atomic": atomic, "count": count,
                      "fresh": connection.connection is not None}
            os.write(write, json.dumps(report).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            child = json.loads(pipe.read())
        os.waitpid(pid, 0)
        return child

    Order.objects.create(item="warm")  # the parent's connection is open
    before = connection.connection is not None
    child = fork_and_report("plain")
    print(json.dumps({"case": "plain", "parent_open_before": before,
                      "parent_open_after": connection.connection is not None, **child}))

    with transaction.atomic():
        Order.objects.create(item="in-transaction")
        kept = connection.connection
        child = fork_and_report("atomic")
        same = connection.connection is kept
        Order.objects.create(item="after-fork")
    items = sorted(Order.objects.values_list("item", flat=True))
    print(json.dumps({"case": "atomic", "parent_kept": same, "items": items, **child}))
""")


def by_case(lines: list[Any]) -> dict[str, dict[str, Any]]:
    return {line["case"]: line for line in lines}


def test_the_parent_closes_its_connection_before_fork_and_the_child_dials_its_own(
        project: Project) -> None:
    found = by_case(project.python(FORK))
    plain = found["plain"]
    assert plain["parent_open_before"] is True
    assert plain["parent_open_after"] is False  # closed by the before-fork hook
    assert plain["inherited"] is False and plain["fresh"] is True


def test_a_connection_inside_a_transaction_stays_the_parents_and_the_child_forgets_it(
        project: Project) -> None:
    atomic = by_case(project.python(FORK))["atomic"]
    # The parent's transaction carries on, on the same connection, and commits.
    assert atomic["parent_kept"] is True
    assert {"in-transaction", "after-fork"} <= set(atomic["items"])
    assert atomic["count"] == 1
    # The child saw no connection and no transaction of the parent's.
    assert atomic["inherited"] is False and atomic["atomic"] is False
    assert atomic["fresh"] is True


AROUND_A_JOB = textwrap.dedent("""
    import json
    from django.db import connection
    from orders.models import Order
    from wurk.contrib.django.connections import fresh_connections

    Order.objects.create(item="before")  # CONN_MAX_AGE = 0: obsolete once the query is done
    seen = {}

    def job():
        seen["at_start"] = connection.connection is not None
        Order.objects.create(item="job")
        seen["during"] = connection.connection is not None

    fresh_connections({"jid": "j1"}, "orders", job)
    seen["after"] = connection.connection is not None
    seen["chain"] = [getattr(m, "__name__", repr(m))
                     for m in __import__("wurk").default_config().server_middleware]
    print(json.dumps(seen))
""")


def test_close_old_connections_runs_around_each_job(project: Project) -> None:
    [seen] = project.python(AROUND_A_JOB)
    assert seen == {"at_start": False, "during": True, "after": False,
                    "chain": ["fresh_connections"]}


ON_COMMIT = textwrap.dedent("""
    import json, os
    import redis
    from django.db import transaction
    from orders.jobs import fulfil_order
    from orders.models import Order
    from wurk.contrib.django import enqueue_on_commit, on_commit

    r = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)

    def queued():
        return [json.loads(raw)["jid"] for raw in r.lrange("queue:orders", 0, -1)]

    def report(case, **fields):
        print(json.dumps({"case": case, **fields}))

    jid = fulfil_order.perform_async(1)
    report("autocommit", jid=jid, queued=queued())
    r.delete("queue:orders")

    with transaction.atomic():
        jid = fulfil_order.perform_async(2)
        inside = queued()
        with transaction.atomic():
            nested = fulfil_order.perform_async(3)
        inside_after_savepoint = queued()
    report("committed", jid=jid, nested=nested, inside=inside,
           inside_after_savepoint=inside_after_savepoint, queued=queued())
    r.delete("queue:orders")

    try:
        with transaction.atomic():
            lost = fulfil_order.perform_async(4)
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    report("rolled_back", jid=lost, queued=queued())

    with transaction.atomic():
        with on_commit(False):
            now = fulfil_order.perform_async(5)
        inside = queued()
    report("opted_out", jid=now, inside=inside)
    r.delete("queue:orders")

    with transaction.atomic():
        jids = fulfil_order.perform_bulk([[6], [7]])
        inside = queued()
    report("bulk", jids=jids, inside=inside, queued=queued())
    r.delete("queue:orders")

    with transaction.atomic():
        jid = fulfil_order.perform_in(60, 8)
        inside = r.zcard("schedule")
    report("scheduled", jid=jid, inside=inside, after=r.zcard("schedule"))
""")


def test_pushes_inside_a_transaction_wait_for_its_commit(project: Project,
                                                         r: redis.Redis) -> None:
    found = by_case(project.python(ON_COMMIT))
    assert found["autocommit"]["queued"] == [found["autocommit"]["jid"]]
    committed = found["committed"]
    assert committed["inside"] == [] and committed["inside_after_savepoint"] == []
    # The jids came back at once, and are the ones written at the commit.
    assert sorted(committed["queued"]) == sorted([committed["jid"], committed["nested"]])
    rolled = found["rolled_back"]
    assert isinstance(rolled["jid"], str) and rolled["queued"] == []
    assert found["opted_out"]["inside"] == [found["opted_out"]["jid"]]
    bulk = found["bulk"]
    assert len(bulk["jids"]) == 2 and bulk["inside"] == []
    assert sorted(bulk["queued"]) == sorted(bulk["jids"])
    assert found["scheduled"]["inside"] == 0 and found["scheduled"]["after"] == 1


EXPLICIT = textwrap.dedent("""
    import json, os
    import redis
    from django.db import transaction
    from orders.jobs import fulfil_order
    from wurk.contrib.django import enqueue_on_commit

    r = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
    with transaction.atomic():
        at_once = fulfil_order.perform_async(1)
        waits = enqueue_on_commit(fulfil_order, 2)
        inside = r.llen("queue:orders")
    print(json.dumps({"at_once": at_once, "waits": waits, "inside": inside,
                      "after": r.llen("queue:orders")}))
""")


def test_with_on_commit_off_only_enqueue_on_commit_waits(project: Project, tmp_path: Any) -> None:
    (tmp_path / "eager_settings.py").write_text(
        "from mysite.settings import *\nWURK_ON_COMMIT = False\n")
    env = {"DJANGO_SETTINGS_MODULE": "eager_settings",
           "PYTHONPATH": f"{tmp_path}:{project.env['PYTHONPATH']}"}
    [seen] = project.python(EXPLICIT, env=env)
    assert seen["inside"] == 1 and seen["after"] == 2
    assert isinstance(seen["waits"], str)


def test_a_bad_on_commit_setting_fails_at_start(unmigrated: Project, tmp_path: Any) -> None:
    (tmp_path / "bad_settings.py").write_text(
        "from mysite.settings import *\nWURK_ON_COMMIT = 'replica'\n")
    env = {"DJANGO_SETTINGS_MODULE": "bad_settings",
           "PYTHONPATH": f"{tmp_path}:{unmigrated.env['PYTHONPATH']}"}
    done = unmigrated.run("-c", "import django; django.setup()", check=False, env=env)
    assert done.returncode != 0
    assert "settings.WURK_ON_COMMIT must be true, false or a database alias" in done.stderr


def test_the_deferred_push_keeps_its_payload(project: Project, r: redis.Redis) -> None:
    project.python(textwrap.dedent("""
        from django.db import transaction
        from orders.jobs import fulfil_order
        with transaction.atomic():
            fulfil_order.set(retry=7, tags=["t"]).perform_async(9)
    """))
    [raw] = r.lrange("queue:orders", 0, -1)
    payload = json.loads(raw)
    assert payload["args"] == [9] and payload["retry"] == 7 and payload["tags"] == ["t"]
    assert payload["class"] == "orders.jobs.fulfil_order" and "enqueued_at" in payload


HOOKED = textwrap.dedent("""
    import json, os
    import wurk
    from wurk.settings.config import Config
    # As a swarm child does after the fork: install the slot's own config.
    config = wurk.configure(Config(redis_url=os.environ["REDIS_URL"]))
    again = wurk.configure(config)  # a second install adds nothing twice
    print(json.dumps({
        "errors": [h.__name__ for h in config.error_handlers],
        "server": [getattr(m, "__name__", repr(m)) for m in config.server_middleware],
        "client": [repr(m) for m in config.client_middleware],
    }))
""")


def test_every_config_a_worker_installs_gets_the_hooks(unmigrated: Project,
                                                       tmp_path: Any) -> None:
    (tmp_path / "hook_settings.py").write_text(textwrap.dedent("""
        from mysite.settings import *

        def report(exc, context):
            pass

        WURK = {**WURK, "error_handlers": ["hook_settings.report"]}
    """))
    env = {"DJANGO_SETTINGS_MODULE": "hook_settings",
           "PYTHONPATH": f"{tmp_path}:{unmigrated.env['PYTHONPATH']}"}
    [seen] = unmigrated.python(HOOKED, env=env)
    assert seen == {"errors": ["report"], "server": ["fresh_connections"],
                    "client": ["OnCommit(using='default', automatic=True)"]}


VIEW = textwrap.dedent("""
    import json, os
    import redis
    from django.test import Client
    from orders.models import Order
    reply = Client().post("/orders/lamp/").json()
    r = redis.Redis.from_url(os.environ["REDIS_URL"], decode_responses=True)
    [job] = [json.loads(raw) for raw in r.lrange("queue:orders", 0, -1)]
    print(json.dumps({"reply": reply, "job": job, "orders": Order.objects.count()}))
""")


def test_a_view_pushes_after_its_transaction_commits(project: Project) -> None:
    [seen] = project.python(VIEW)
    assert seen["orders"] == 1
    assert seen["job"]["jid"] == seen["reply"]["jid"]
    assert seen["job"]["args"] == [seen["reply"]["order"]]


REDIS_AWAY = textwrap.dedent("""
    import json
    from django.db import transaction
    from orders.jobs import fulfil_order
    from orders.models import Order
    raised = None
    try:
        with transaction.atomic():
            order = Order.objects.create(item="kept")
            jid = fulfil_order.perform_async(order.pk)
    except Exception as exc:
        raised = type(exc).__name__
    print(json.dumps({"raised": raised, "jid": jid, "orders": Order.objects.count()}))
""")


@pytest.mark.parametrize(("reliable", "raised"), [("true", None), ("false", "ConnectError")])
def test_a_deferred_push_that_redis_refuses_is_kept_or_raised_after_the_commit(
        project: Project, reliable: str, raised: str | None) -> None:
    away = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "WURK_RELIABLE_PUSH": reliable,
            "WURK_REDIS_RETRY_ATTEMPTS": "1", "WURK_REDIS_CONNECT_TIMEOUT": "0.5",
            "WURK_PUSH_FLUSH_TIMEOUT": "0.5"}
    [seen] = project.python(REDIS_AWAY, env=away)
    # The rows are committed either way. With reliable_push the job waits in
    # memory (then the spool); without it the push's error reaches the caller.
    assert seen["orders"] == 1 and isinstance(seen["jid"], str)
    assert seen["raised"] == raised
