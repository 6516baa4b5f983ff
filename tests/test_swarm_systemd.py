"""``wurk-swarm`` under systemd: READY once every child is up, STOPPING on
TERM, a watchdog fed only while the children beat; and the ``Notifier`` on
its own (abstract and path sockets, the watchdog interval).

Real ``wurk-swarm`` subprocesses (the ``launch`` fixture of tests/swarms.py)
and a real notify socket (``notify_socket``, also from there).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
import redis
import swarms
from swarms import Launch, receive, slot, watchdog_pings

from supervisor.systemd import Notifier

pytestmark = pytest.mark.timeout(60)

launch = swarms.launch
notify_socket = swarms.notify_socket


def test_systemd_hears_ready_after_every_child_and_stopping_on_term(
        launch: Launch, r: redis.Redis, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    swarm = launch(slot("alpha", count=2, concurrency=1, queues=["qa"]),
                   slot("beta", concurrency=1, queues=["qb"]),
                   layout={"alpha": 2, "beta": 1}, env={"NOTIFY_SOCKET": path})
    message = receive(sock, 15)
    assert message.get("READY") == "1", message
    # By the time systemd hears READY every child is up and registered.
    ready = swarm.ready()
    assert set(ready) == {("alpha", 0), ("alpha", 1), ("beta", 0)}
    assert message["STATUS"] == "alpha: 2/2, beta: 1/1"

    swarm.send(signal.SIGTERM)
    stopping = receive(sock, 10)
    assert stopping.get("STOPPING") == "1", stopping
    assert swarm.wait_exit() == 0


def test_watchdog_is_fed_only_while_children_beat(
        launch: Launch, notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    swarm = launch(slot("alpha", concurrency=1, queues=["qa"]), layout={"alpha": 1},
                   env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "1000000"})
    child = swarm.wait_ready()[("alpha", 0)]["pid"]
    assert watchdog_pings(sock, 3) >= 2
    os.kill(child, signal.SIGSTOP)  # a wedged child: its heartbeat goes stale
    try:
        watchdog_pings(sock, 2.5)  # beats age past 3 x 0.5 s in this window
        assert watchdog_pings(sock, 2) == 0
    finally:
        os.kill(child, signal.SIGCONT)
    assert watchdog_pings(sock, 3) >= 1
    swarm.send(signal.SIGTERM)
    assert swarm.wait_exit() == 0


def test_notifier_speaks_to_abstract_and_path_sockets(tmp_path: Path) -> None:
    name = f"wurk-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notifier = Notifier("@" + name)
        assert notifier.enabled
        assert notifier.notify(READY=1, STATUS="ok")
        assert receive(sock, 2) == {"READY": "1", "STATUS": "ok"}
        notifier.close()
    quiet = Notifier(None)
    assert not quiet.enabled
    assert quiet.notify(READY=1) is False
    # Nobody listening: reported, not raised.
    nobody = Notifier(str(tmp_path / "nobody.sock"))
    assert nobody.notify(READY=1) is False
    nobody.close()


def test_notifier_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert Notifier("@x").watchdog_interval() == 1.5
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert Notifier("@x").watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert Notifier("@x").watchdog_interval() == 1.5
    monkeypatch.setenv("WATCHDOG_USEC", "soon")
    assert Notifier("@x").watchdog_interval() is None
