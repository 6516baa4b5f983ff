"""Cron schedules in a time zone: when a periodic entry's ticks fall.

The cron maths is cronsim's (the ``wurk[periodic]`` extra), imported only
when a schedule is built, so ``import wurk`` never needs it. cronsim follows
Debian's cron, DST rule included:

- A schedule with a fixed minute and hour (``30 2 * * *``) is matched on the
  local wall clock. A local time that does not exist (spring forward) fires
  at the first instant after the gap (03:00 where 02:00-03:00 is skipped);
  a local time that happens twice (fall back) fires at its first occurrence
  only. So a 02:30 job runs exactly once on both days.
- A schedule whose minute or hour is a wildcard or a step (``*/5 * * * *``,
  ``30 * * * *``) runs on real elapsed time: every occurrence that happens
  runs, so an hourly job runs in both repeated hours of a fall-back night
  and once in the hour that spring forward removes.

Duties:
1. Check a schedule and a zone (:class:`CronError` says what is wrong):
   5 fields, or one of ``@hourly @daily @midnight @weekly @monthly
   @yearly @annually``; an IANA zone name.
2. ``next_after(t)``: the first tick strictly after epoch ``t``.
3. ``due(mark, now)``: the first and the latest tick after ``mark`` and
   at most ``now``, without walking years of ticks after a long outage.
"""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from wurk.core.validate import is_text

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
MAX_EXPRESSION = 200
# Forward steps ``due`` takes before it asks for the latest tick directly.
MAX_WALK = 1000
# A tick's wall-clock time in an ambiguous hour may map before the start:
# cronsim is asked again this many times for one strictly later.
MAX_RETRIES = 4


class CronError(ValueError):
    """A schedule or zone that cannot be used; the message says which and why."""


def _cronsim() -> Any:
    try:
        import cronsim  # noqa: PLC0415 - optional extra, loaded only for periodic jobs
    except ImportError:
        raise CronError("periodic jobs need the cronsim package: "
                        "pip install 'wurk[periodic]'") from None
    return cronsim


def zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA zone ``name``, or a CronError naming it."""
    if not is_text(name, MAX_EXPRESSION):
        raise CronError(f"tz must be an IANA zone name such as 'Europe/Paris', got {name!r}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {name!r} (an IANA name such as 'Europe/Paris'; "
                        f"install tzdata where the system has no zone files)") from None


def expand(expr: str) -> str:
    """The 5-field form of ``expr`` (aliases expanded), or a CronError."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > MAX_EXPRESSION:
        raise CronError(f"cron schedule must be a non-empty string, got {expr!r}")
    text = " ".join(expr.split())
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise CronError(f"unknown cron name {expr!r} (one of {', '.join(ALIASES)})")
        return ALIASES[text.lower()]
    if len(text.split()) != 5:
        raise CronError(f"cron schedule {expr!r} needs 5 fields "
                        f"(minute hour day-of-month month day-of-week)")
    return text


@dataclass(frozen=True)
class Schedule:
    """A cron expression evaluated in one zone; times are UTC epoch seconds."""

    expr: str
    tz: str = "UTC"
    fields: str = field(init=False, compare=False)
    _zone: zoneinfo.ZoneInfo = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        fields = expand(self.expr)
        object.__setattr__(self, "fields", fields)
        object.__setattr__(self, "_zone", zone(self.tz))
        self._iterate(0)  # cronsim checks the fields when it is built

    def _iterate(self, start: int) -> Any:
        cronsim = _cronsim()
        moment = datetime.fromtimestamp(start, tz=UTC).astimezone(self._zone)
        try:
            return cronsim.CronSim(self.fields, moment)
        except cronsim.CronSimError as exc:
            raise CronError(f"cron schedule {self.expr!r}: {exc}") from None

    def next_after(self, t: float) -> int | None:
        """The first tick strictly after ``t`` (None if there is none within 50 years)."""
        start = int(t // 1)
        ticks = self._iterate(start)
        for _ in range(MAX_RETRIES):
            try:
                when = int(next(ticks).timestamp())
            except StopIteration:
                return None
            if when > start:
                return when
        return None

    def latest_at_or_before(self, t: float) -> int | None:
        """The last tick at or before ``t``, by iterating backwards."""
        cronsim = _cronsim()
        moment = datetime.fromtimestamp(int(t // 1) + 1, tz=UTC).astimezone(self._zone)
        try:
            when = int(next(cronsim.CronSim(self.fields, moment, reverse=True)).timestamp())
        except StopIteration:
            return None
        return when if when <= t else None

    def due(self, mark: float, now: float) -> tuple[int, int] | None:
        """``(first, latest)``: the first and the last tick in ``(mark, now]``,
        or None when none is due."""
        first = self.next_after(mark)
        if first is None or first > now:
            return None
        latest = first
        for _ in range(MAX_WALK):
            following = self.next_after(latest)
            if following is None or following > now:
                return first, latest
            latest = following
        # Years of a frequent schedule: ask for the latest directly.
        direct = self.latest_at_or_before(now)
        return first, (direct if direct is not None and direct > latest else latest)

    def upcoming(self, after: float, count: int) -> list[int]:
        """The next ``count`` ticks after ``after``."""
        ticks: list[int] = []
        t: float = after
        for _ in range(count):
            nxt = self.next_after(t)
            if nxt is None:
                break
            ticks.append(nxt)
            t = nxt
        return ticks


def local_text(epoch: float, tz: str) -> str:
    """An epoch as wall-clock time in ``tz``, ISO 8601 with its offset."""
    offset = datetime.fromtimestamp(epoch, tz=UTC).astimezone(zone(tz))
    return offset.isoformat(timespec="seconds")


__all__ = ["ALIASES", "CronError", "Schedule", "expand", "local_text", "zone"]
