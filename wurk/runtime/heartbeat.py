"""The heartbeat: how Sidekiq's API and Web UI see this process.

Duties, every ``heartbeat_interval`` seconds (and once at start):
1. Flush processed/failed counts to ``stat:*`` and the per-day keys; then,
   in one more pipeline, the per-class figures in Sidekiq 7's metrics keys
   (:mod:`wurk.observe.class_metrics`), one try, given back if never sent.
2. Publish the in-flight jobs hash under both names Sidekiq reads
   (``<id>:workers`` for 6.4, ``<id>:work`` for 6.5+), with a 60 s TTL.
   A flush Redis refused (at maxmemory) keeps its counts for the next
   beat; it is logged and the beat goes on.
3. Measure a PING round trip, then in one script (BEAT) pop one remote
   signal, register in ``processes`` and write the identity hash (info,
   busy, beat, quiet, rss, rtt_us, concurrency). The pop comes first, so
   the beat still lands at maxmemory and the process stays visible.
   A failed beat, the first one included, is logged and tried again at the
   next interval: it never stops the process.
4. Deliver that signal (TSTP quiet, TERM stop, TTIN dump threads) to the
   launcher's callback, then run the optional ``on_beat`` hook (metrics
   gauges) and note the beat's time in ``last_beat`` (the health probe).
   After every attempt on the thread, taken or failed, call ``on_pulse`` if
   its owner passed one (a swarm child tells its parent it is alive, Redis or not).
   With reliable fetch, re-read Redis's data epoch (``wurk.runtime.epoch``)
   after the beat: how the process notices that Redis lost its data, and
   learns the epoch at boot, before the fetch claims anything.
5. At stop: flush the last counts, leave ``processes`` and delete the work
   hashes, letting the identity hash expire on its own as Sidekiq does.

A beat that raises anything is logged (``heartbeat.error``) and tried again
an interval later; the thread is a :class:`wurk.core.service.Service`.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psutil
import redis.exceptions as rx

from wurk.core.logging import get_logger
from wurk.core.service import Service, logged
from wurk.observe import class_metrics
from wurk.push.buffered import unapplied
from wurk.redis.runtime import Runtime, handed
from wurk.version import __version__
from wurk.wire import keys
from wurk.wire.lua import BEAT
from wurk.wire.payload import dumps

if TYPE_CHECKING:
    from wurk.runtime.epoch import Epoch
    from wurk.runtime.inflight import Counters, InFlightTable
    from wurk.settings.config import Config
    from wurk.settings.queues import QueuePlan

log = get_logger("wurk.heartbeat")
REMOTE_SIGNALS = ("TSTP", "TERM", "TTIN")


def make_identity(hostname: str | None = None, pid: int | None = None) -> str:
    host = hostname or os.environ.get("DYNO") or socket.gethostname()
    return f"{host}:{pid or os.getpid()}:{secrets.token_hex(6)}"


def stats_commands(processed: int, failed: int, day: str) -> list[tuple[Any, ...]]:
    commands: list[tuple[Any, ...]] = []
    for name, count in (("processed", processed), ("failed", failed)):
        daily = keys.daily_stat(name, day)
        commands += [("INCRBY", f"stat:{name}", count), ("INCRBY", daily, count),
                     ("EXPIRE", daily, keys.DAILY_STAT_TTL)]
    return commands


class Heartbeat:
    def __init__(self, config: Config, plan: QueuePlan, *, counters: Counters,
                 in_flight: InFlightTable, on_signal: Callable[[str], None],
                 extra_info: dict[str, Any] | None = None,
                 identity: str | None = None,
                 on_beat: Callable[[], None] | None = None,
                 on_pulse: Callable[[], None] | None = None,
                 epoch: Epoch | None = None, runtime: Runtime | None = None) -> None:
        self.config = config
        self.runtime = handed(runtime, config)
        self.counters = counters
        self.in_flight = in_flight
        self.on_signal = on_signal
        self.on_beat = on_beat
        self.epoch = epoch
        self.on_pulse = on_pulse
        # Monotonic time of the last beat Redis took (None before the first).
        self.last_beat: float | None = None
        self.identity = identity or make_identity()
        self.quiet = False
        self.info = self._info(plan, extra_info or {})
        self._info_json = dumps(self.info)
        self.service = Service("heartbeat", self._step, first_pause=self._interval,
                               failed=logged(log, "heartbeat.error", self._interval))
        self._process = psutil.Process()

    def _info(self, plan: QueuePlan, extra: dict[str, Any]) -> dict[str, Any]:
        hostname, pid, _ = self.identity.rsplit(":", 2)
        # Sidekiq 7+'s capsule shape: strict order is all weights 0 and
        # equal weights of 1 are "random" (a shuffle on every fetch).
        weights = dict.fromkeys(plan.names, 0) if plan.strict else plan.weights()
        mode = "strict" if plan.strict else (
            "random" if set(weights.values()) == {1} else "weighted")
        return {
            "hostname": hostname, "started_at": time.time(), "pid": int(pid),
            "tag": self.config.tag, "concurrency": self.config.concurrency,
            "queues": list(plan.names), "weights": [weights], "labels": self.config.labels,
            "identity": self.identity, "version": __version__, "embedded": False,
            "capsules": {"default": {"concurrency": self.config.concurrency,
                                     "mode": mode,
                                     "weights": weights}},
            **extra,
        }

    def add_info(self, **fields: Any) -> None:
        """Fields known only after construction (``health_port``), sent from the next beat."""
        self.info.update(fields)
        self._info_json = dumps(self.info)

    def start(self) -> None:
        self._beat_logged()
        self.service.start()

    def _step(self) -> float:
        """One beat on the thread, then the owner's pulse; the pause before the next."""
        self._beat_logged()
        if self.on_pulse is not None:
            self.on_pulse()
        return self._interval()

    def _interval(self) -> float:
        return self.config.heartbeat_interval

    def beat_soon(self) -> None:
        """Beat now rather than at the next interval: a state change (quiet)
        shows in Sidekiq's API and Web at once, not up to an interval later."""
        self.service.wake()

    def _beat_logged(self) -> None:
        try:
            self.beat()
        except BaseException as exc:  # noqa: BLE001 - a missed beat is retried next time
            log.error("heartbeat.error", error=f"{type(exc).__name__}: {exc}")

    def beat(self) -> None:
        try:
            self.flush()
        except rx.ResponseError as exc:
            # Refused (at maxmemory, say): the counts wait for the next beat,
            # and the beat itself, which frees before it writes, goes on.
            log.warning("heartbeat.flush_failed", error=f"{type(exc).__name__}: {exc}")
        started = time.perf_counter()
        self.runtime.pool.call("PING", idempotent=True)
        rtt_us = int((time.perf_counter() - started) * 1_000_000)
        fields = ("info", self._info_json, "busy", self.in_flight.busy(),
                  "beat", repr(time.time()), "quiet", "true" if self.quiet else "false",
                  "rss", self._process.memory_info().rss // 1024, "rtt_us", rtt_us,
                  "concurrency", self.config.concurrency)
        signal = self.runtime.pool.run(lambda c: BEAT.run(
            c, [keys.PROCESSES, self.identity, keys.signals(self.identity)],
            [self.identity, keys.HEARTBEAT_TTL, *fields]))
        self.last_beat = time.monotonic()
        if signal is not None:
            self._deliver(signal.decode())
        if self.epoch is not None:
            self._refresh_epoch(self.epoch)
        if self.on_beat is not None:
            self.on_beat()

    def _refresh_epoch(self, epoch: Epoch) -> None:
        try:
            epoch.refresh()
        except Exception as exc:  # noqa: BLE001 - the beat landed; the epoch is read next time
            log.error("heartbeat.epoch_failed", error=f"{type(exc).__name__}: {exc}")

    def flush(self) -> None:
        """Counts and in-flight jobs, in one transaction; counts survive a failed dial."""
        processed, failed = self.counters.take()
        day = datetime.now(UTC).strftime("%Y-%m-%d")
        commands = stats_commands(processed, failed, day)
        work = self.in_flight.work_hash()
        for key in (keys.work_6_4(self.identity), keys.work(self.identity)):
            commands.append(("UNLINK", key))
            if work:
                fields = [x for pair in work.items() for x in pair]
                commands += [("HSET", key, *fields), ("EXPIRE", key, keys.HEARTBEAT_TTL)]
        try:
            self.runtime.pool.pipeline(commands, transaction=True)
        except Exception as exc:
            if unapplied(exc) or isinstance(exc, rx.OutOfMemoryError):
                # Never sent, or refused outright (NOREPLICAS during a
                # failover, OOM: a transaction Redis refused applies nothing).
                self.counters.give_back(processed, failed)
                raise
            # Sent but unconfirmed: adding the counts back could count them
            # twice, so they are dropped and the loss is logged.
            log.error("heartbeat.stats_lost", processed=processed, failed=failed)
            raise
        self._flush_classes()

    def _flush_classes(self) -> None:
        """Per-class figures, one pipeline apart from the counts: a bad key (WRONGTYPE)
        there costs these figures only, never the processed/failed totals."""
        taken = self.counters.classes.take()
        commands = class_metrics.flush_commands(taken, layout=self.config.class_metrics_format)
        if not commands:
            return
        try:
            replies = self.runtime.pool.run(
                lambda c: c.pipeline(commands, raise_on_error=False), attempts=1)
        except Exception as exc:
            if unapplied(exc):
                self.counters.classes.give_back(taken)
            raise
        refused = [r for r in replies if isinstance(r, rx.ResponseError)]
        if refused:
            log.warning("heartbeat.class_metrics_refused", errors=len(refused),
                        error=str(refused[0]))

    def _deliver(self, name: str) -> None:
        if name not in REMOTE_SIGNALS:
            log.warning("heartbeat.unknown_signal", signal=name)
            return
        log.info("heartbeat.signal", signal=name)
        self.on_signal(name)

    def stop(self) -> None:
        """Last counts and goodbye, each tried on its own within the pool's deadline."""
        self.service.stop(self.runtime.pool.deadline.clip(5.0))
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - Redis may be gone or full at exit
            log.error("heartbeat.flush_failed", error=f"{type(exc).__name__}: {exc}")
        try:
            # SREM and UNLINK only free memory: they work at maxmemory too.
            self.runtime.pool.pipeline([
                ("SREM", keys.PROCESSES, self.identity),
                ("UNLINK", keys.work_6_4(self.identity), keys.work(self.identity)),
            ], idempotent=True)
        except Exception as exc:  # noqa: BLE001 - Redis may be gone at exit
            log.error("heartbeat.goodbye_failed", error=f"{type(exc).__name__}: {exc}")
