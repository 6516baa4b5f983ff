"""A background pusher for the chaos and failover tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import wurk
from wurk.wire.payload import new_jid


def jid_only(jid: str) -> list[Any]:
    return [jid]


@dataclass
class Pusher:
    """Pushes one ``job`` every ``every`` seconds from a thread.

    Jids are made here, so each push is known: ``accepted`` when push
    returned, ``uncertain`` (with the error) when it raised, its outcome unknown.
    """

    client: wurk.Client
    job: str
    args: Callable[[str], list[Any]] = jid_only
    every: float = 0.01
    accepted: list[str] = field(default_factory=list)
    uncertain: list[tuple[str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pusher", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            jid = new_jid()
            try:
                self.client.push({"class": self.job, "args": self.args(jid), "jid": jid,
                                  "retry": 3})
            except Exception as exc:  # noqa: BLE001 - recorded: the outcome is unknown
                self.uncertain.append((jid, f"{type(exc).__name__}: {exc}"))
            else:
                self.accepted.append(jid)
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
