"""Job and process metrics for statsd, DogStatsD and Prometheus, with no dependencies.

Duties:
1. Parse and check ``metrics_url`` (``udp://host:port``).
2. Time and count every job while metrics are on: counters
   ``wurk.jobs.processed`` and ``wurk.jobs.failed`` and the timing
   ``wurk.jobs.duration`` (ms), tagged with class and queue, in one datagram
   per job; ``wurk.jobs.expired`` for a job dropped unrun past its
   ``expiry``. While they are off the job path gains nothing: the processor
   wraps its run only when :func:`for_config` returns a :class:`Metrics`.
   A job a limiter rescheduled counts as processed, not failed, and once in
   ``wurk.jobs.overlimit`` (class and queue tags).
3. Once per heartbeat: the gauges ``wurk.queue.latency`` (seconds, one per
   queue the process polls) and ``wurk.process.rss`` (bytes), the latter
   tagged with the swarm slot and index when there are any.
4. Tags: DogStatsD's ``|#k:v,k:v`` with ``metrics_dogstatsd``; otherwise
   folded into the name (``wurk.jobs.processed.class.Mailer.queue.default``).
5. Send without blocking; a send that fails is dropped and counted in
   ``send_errors``, and nothing metrics raise reaches a job or the heartbeat.
   Metrics run no thread of their own.
6. With ``metrics_prometheus``, keep in-process totals that the health
   listener serves as Prometheus text on ``/metrics``.
7. Fork hygiene: a child never sends through its parent's UDP socket or
   reports its parent's totals. :func:`reset` runs in every forked child
   (:mod:`wurk.runtime.forking` calls :func:`reset`).
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from wurk.core.logging import get_logger
from wurk.limiter.base import reschedulable
from wurk.settings.addresses import parse_metrics_url
from wurk.wire import keys
from wurk.wire.payload import latency_of

if TYPE_CHECKING:
    from wurk.redis.runtime import Runtime
    from wurk.settings.config import Config

log = get_logger("wurk.metrics")
Tags = tuple[tuple[str, str], ...]
Gauge = tuple[str, float, Tags]
E = TypeVar("E")
RunJob = Callable[[dict[str, Any], str, E], "BaseException | None"]

PROCESSED = "wurk.jobs.processed"
FAILED = "wurk.jobs.failed"
DURATION = "wurk.jobs.duration"
OVER_LIMIT = "wurk.jobs.overlimit"
EXPIRED = "wurk.jobs.expired"
QUEUE_LATENCY = "wurk.queue.latency"
PROCESS_RSS = "wurk.process.rss"
# DogStatsD's advice for UDP: stay under one Ethernet frame's payload.
MAX_PACKET = 1432
# After the agent's address cannot be resolved or a socket cannot be made.
REOPEN_PAUSE = 5.0
_FOLD_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_TAG_UNSAFE = re.compile(r"[,|#\s]")


def format_metric(name: str, value: float, kind: str, tags: Tags, *, dogstatsd: bool) -> str:
    """One statsd line: ``name:value|kind`` plus tags the way the agent takes them."""
    if dogstatsd:
        suffix = "|#" + ",".join(f"{k}:{_TAG_UNSAFE.sub('_', v)}" for k, v in tags) if tags else ""
        return f"{name}:{_number(value)}|{kind}{suffix}"
    folded = name + "".join(f".{k}.{_FOLD_UNSAFE.sub('_', v)}" for k, v in tags)
    return f"{folded}:{_number(value)}|{kind}"


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(round(value, 3))


def packets(lines: Sequence[str], limit: int = MAX_PACKET) -> list[bytes]:
    """Lines joined by newlines (statsd's multi-metric datagram), each packet within ``limit``."""
    out: list[bytes] = []
    current = b""
    for line in lines:
        data = line.encode()
        if current and len(current) + 1 + len(data) > limit:
            out.append(current)
            current = b""
        current = current + b"\n" + data if current else data
    if current:
        out.append(current)
    return out


def job_class(job: Mapping[str, Any]) -> str:
    """The class a job is reported under: ActiveJob's ``wrapped`` one when present."""
    return str(job.get("wrapped") or job.get("class"))


def process_tags(extra_info: Mapping[str, Any]) -> Tags:
    """The slot and index of a swarm child (nothing for a lone ``wurk run``)."""
    return tuple((k, str(extra_info[k])) for k in ("slot", "index") if k in extra_info)


class StatsdSender:
    """A non-blocking UDP socket to one agent, opened on first use and after a fork."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.send_errors = 0
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._reopen_at = 0.0

    @property
    def sock(self) -> socket.socket | None:
        """The socket in use, if one is open (for tests and diagnostics)."""
        return self._sock

    def send(self, packet: bytes) -> None:
        sock = self._sock or self._open()
        try:
            if sock is None:
                raise OSError("no socket to the statsd agent")
            sock.send(packet)
        except OSError:
            # A full buffer, an agent that is not listening (ECONNREFUSED from an
            # earlier datagram's ICMP reply): metrics are best effort.
            with self._lock:
                self.send_errors += 1

    def _open(self) -> socket.socket | None:
        with self._lock:
            if self._sock is not None or time.monotonic() < self._reopen_at:
                return self._sock
            try:
                family, kind, proto, _, address = socket.getaddrinfo(
                    self.host, self.port, type=socket.SOCK_DGRAM)[0]
                sock = socket.socket(family, kind, proto)
                sock.setblocking(False)
                sock.connect(address)
            except OSError as exc:
                self._reopen_at = time.monotonic() + REOPEN_PAUSE
                log.warning("metrics.socket_failed", host=self.host, port=self.port,
                            error=f"{type(exc).__name__}: {exc}")
                return None
            self._sock = sock
            return sock

    def reset(self) -> None:
        """Forget the socket (closing only this process's copy) and start counting afresh.

        The lock is replaced, never taken: another thread may have held it at fork.
        """
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self._lock = threading.Lock()
        self._reopen_at = 0.0
        self.send_errors = 0


class Totals:
    """In-process sums for Prometheus: per (class, queue) counts and seconds, and gauges."""

    GAUGES = {QUEUE_LATENCY: ("wurk_queue_latency_seconds", "Age of the oldest job in a queue."),
              PROCESS_RSS: ("wurk_process_rss_bytes", "Resident memory of this process.")}

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._lock = threading.Lock()
        self.jobs: dict[tuple[str, str], list[float]] = {}  # [processed, failed, seconds]
        self.over_limit: dict[tuple[str, str], int] = {}
        self.gauges: dict[tuple[str, Tags], float] = {}
        self.expired: dict[tuple[str, str], int] = {}

    def job(self, cls: str, queue: str, seconds: float, failed: bool) -> None:
        with self._lock:
            row = self.jobs.setdefault((cls, queue), [0, 0, 0.0])
            row[0] += 1
            row[1] += failed
            row[2] += seconds

    def count_over_limit(self, cls: str, queue: str) -> None:
        with self._lock:
            self.over_limit[(cls, queue)] = self.over_limit.get((cls, queue), 0) + 1

    def expire(self, cls: str, queue: str) -> None:
        with self._lock:
            self.expired[(cls, queue)] = self.expired.get((cls, queue), 0) + 1

    def gauge(self, name: str, value: float, tags: Tags) -> None:
        with self._lock:
            self.gauges[(name, tags)] = value

    def render(self, send_errors: int = 0) -> str:
        """The Prometheus text exposition format (version 0.0.4)."""
        with self._lock:
            jobs = sorted((_labels((("class", c), ("queue", q))), row)
                          for (c, q), row in self.jobs.items())
            gauges = sorted(self.gauges.items())
            over = sorted((_labels((("class", c), ("queue", q))), n)
                          for (c, q), n in self.over_limit.items())
            expired = sorted((_labels((("class", c), ("queue", q))), n)
                             for (c, q), n in self.expired.items())
        lines = _family("wurk_jobs_processed_total", "counter", "Jobs run, failed or not.",
                        [("", labels, int(row[0])) for labels, row in jobs])
        lines += _family("wurk_jobs_failed_total", "counter", "Jobs that raised.",
                         [("", labels, int(row[1])) for labels, row in jobs])
        lines += _family("wurk_jobs_duration_seconds", "summary", "Time spent running jobs.",
                         [(suffix, labels, value) for labels, row in jobs
                          for suffix, value in (("_sum", row[2]), ("_count", int(row[0])))])
        lines += _family("wurk_jobs_overlimit_total", "counter",
                         "Jobs rescheduled because a limiter refused them.",
                         [("", labels, n) for labels, n in over])
        lines += _family("wurk_jobs_expired_total", "counter", "Jobs dropped unrun past expiry.",
                         [("", labels, n) for labels, n in expired])
        for name, (metric, help_text) in self.GAUGES.items():
            lines += _family(metric, "gauge", help_text,
                             [("", _labels(tags), value)
                              for (gauge, tags), value in gauges if gauge == name])
        lines += _family("wurk_metrics_send_errors_total", "counter",
                         "Statsd datagrams that could not be sent.", [("", "", send_errors)])
        return "\n".join(lines) + "\n"


def _family(metric: str, kind: str, help_text: str,
            samples: Sequence[tuple[str, str, float]]) -> list[str]:
    """One metric family: HELP and TYPE, then ``name<suffix>{labels} value`` per sample."""
    return [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}",
            *(f"{metric}{suffix}{labels} {value!r}" for suffix, labels, value in samples)]


def _labels(tags: Tags) -> str:
    if not tags:
        return ""
    escaped = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in tags)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(tags, escaped, strict=True)) + "}"


class Metrics:
    """Where one process's metrics go: a statsd agent, in-process totals, or both."""

    def __init__(self, sender: StatsdSender | None, *, dogstatsd: bool = False,
                 totals: Totals | None = None) -> None:
        self.sender = sender
        self.dogstatsd = dogstatsd
        self.totals = totals

    @property
    def send_errors(self) -> int:
        return self.sender.send_errors if self.sender is not None else 0

    def job(self, cls: str, queue: str, ms: float, failed: bool) -> None:
        tags = (("class", cls), ("queue", queue))
        if self.sender is not None:
            lines = [self._line(PROCESSED, 1, "c", tags)]
            if failed:
                lines.append(self._line(FAILED, 1, "c", tags))
            lines.append(self._line(DURATION, ms, "ms", tags))
            self.sender.send("\n".join(lines).encode())
        if self.totals is not None:
            self.totals.job(cls, queue, ms / 1000.0, failed)

    def over_limit(self, cls: str, queue: str) -> None:
        """One job rescheduled by a limiter (``wurk.runtime.overlimit``)."""
        if self.sender is not None:
            tags = (("class", cls), ("queue", queue))
            self.sender.send(self._line(OVER_LIMIT, 1, "c", tags).encode())
        if self.totals is not None:
            self.totals.count_over_limit(cls, queue)
    def expired(self, cls: str, queue: str) -> None:
        if self.sender is not None:
            self.sender.send(self._line(EXPIRED, 1, "c", (("class", cls), ("queue", queue)))
                             .encode())
        if self.totals is not None:
            self.totals.expire(cls, queue)

    def gauges(self, values: Sequence[Gauge]) -> None:
        if self.sender is not None:
            for packet in packets([self._line(n, v, "g", t) for n, v, t in values]):
                self.sender.send(packet)
        if self.totals is not None:
            for name, value, tags in values:
                self.totals.gauge(name, value, tags)

    def _line(self, name: str, value: float, kind: str, tags: Tags) -> str:
        return format_metric(name, value, kind, tags, dogstatsd=self.dogstatsd)

    def timed(self, run: RunJob[E]) -> RunJob[E]:
        """``run`` (the processor's ``_run``), timed and counted; it still returns the failure."""

        def measured(job: dict[str, Any], queue: str, entry: E) -> BaseException | None:
            started = time.perf_counter()
            failure = run(job, queue, entry)
            try:
                failed = failure is not None and not reschedulable(failure, job)
                self.job(job_class(job), queue, (time.perf_counter() - started) * 1000.0, failed)
            except BaseException as exc:  # noqa: BLE001 - a metrics bug must not touch the job
                log.warning("metrics.job_failed", error=f"{type(exc).__name__}: {exc}")
            return failure

        return measured

    def reset(self) -> None:
        if self.sender is not None:
            self.sender.reset()
        if self.totals is not None:
            self.totals.reset()


_instances: dict[tuple[str | None, bool, bool], Metrics] = {}
_instances_lock = threading.Lock()


def for_config(config: Config) -> Metrics | None:
    """This process's :class:`Metrics` for ``config``'s settings, or None when metrics are off.

    One per distinct setting, so the processors and the health listener share totals.
    """
    if config.metrics_url is None and not config.metrics_prometheus:
        return None
    key = (config.metrics_url, config.metrics_dogstatsd, config.metrics_prometheus)
    with _instances_lock:
        found = _instances.get(key)
        if found is None:
            sender = (StatsdSender(*parse_metrics_url(config.metrics_url))
                      if config.metrics_url is not None else None)
            found = Metrics(sender, dogstatsd=config.metrics_dogstatsd,
                            totals=Totals() if config.metrics_prometheus else None)
            _instances[key] = found
        return found


def reset() -> None:
    """After a fork, in the child: fresh sockets, locks and totals for every instance."""
    global _instances_lock  # noqa: PLW0603 - replaced, not taken: it may be held mid-fork
    _instances_lock = threading.Lock()
    for metrics in list(_instances.values()):
        metrics.reset()


def beat_reporter(runtime: Runtime, queues: Sequence[str],
                  tags: Tags = ()) -> Callable[[], None] | None:
    """The heartbeat's per-beat gauges (queue latency, RSS); None when metrics are off."""
    metrics = for_config(runtime.config)
    if metrics is None:
        return None

    def report() -> None:
        values: list[Gauge] = []
        try:
            values += [(QUEUE_LATENCY, latency, (("queue", name),))
                       for name, latency in queue_latencies(runtime, queues)]
        except Exception as exc:  # noqa: BLE001 - Redis trouble: the next beat tries again
            log.warning("metrics.latency_failed", error=f"{type(exc).__name__}: {exc}")
        try:
            import psutil  # noqa: PLC0415 - the heartbeat has it loaded already

            values.append((PROCESS_RSS, psutil.Process().memory_info().rss, tags))
            metrics.gauges(values)
        except BaseException as exc:  # noqa: BLE001 - never break the heartbeat
            log.warning("metrics.beat_failed", error=f"{type(exc).__name__}: {exc}")

    return report


def queue_latencies(runtime: Runtime, queues: Sequence[str]) -> list[tuple[str, float]]:
    """Seconds the oldest job of each queue has waited (0 when empty), in one round trip."""
    if not queues:
        return []
    oldest = runtime.pool.pipeline([("LINDEX", keys.queue(q), -1) for q in queues],
                                   idempotent=True, attempts=1)
    now = time.time()
    return [(q, max(0.0, latency_of(raw, now))) for q, raw in zip(queues, oldest, strict=True)]
