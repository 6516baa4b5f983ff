"""The topology file's ``[[periodic]]`` tables: periodic entries the swarm parent runs.

Duties:
1. Read each ``[[periodic]]`` table (``schedule``, ``job``, and optionally
   ``name``, ``args``, ``tz``, ``queue``, ``retry``, ``missed``, ``paused``)
   into a :class:`wurk.push.periodic.PeriodicEntry`.
2. Refuse a bad one before anything forks, with a TopologyError naming the
   file, the entry (its index and name) and the key: an unknown key, a cron
   schedule or zone that does not parse, a job name that is not a string,
   ``args`` that is not a JSON list, a name used twice.
"""

from __future__ import annotations

from typing import Any

from wurk.core.suggest import did_you_mean
from wurk.push.periodic import PeriodicEntry, PeriodicError, make_entry

KEYS = {"name", "schedule", "job", "args", "tz", "queue", "retry", "missed", "paused"}


def parse_periodic(raw: Any, where: str) -> tuple[PeriodicEntry, ...]:
    """The entries of the ``periodic`` array of tables; ValueError names the bad one."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ValueError(f"{where}: periodic must be [[periodic]] tables, got {raw!r:.80}")
    entries = tuple(_entry(table, i, where) for i, table in enumerate(raw))
    names = [e.name for e in entries]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise ValueError(f"{where}: periodic name {duplicate!r} is used by more than one "
                         f"[[periodic]] entry; give each its own name")
    return entries


def _entry(table: dict[str, Any], index: int, where: str) -> PeriodicEntry:
    label = table.get("name") if isinstance(table.get("name"), str) else table.get("job")
    at = f"{where}: periodic[{index}]" + (f" ({label!r})" if isinstance(label, str) else "")
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ValueError(f"{at}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], KEYS)} "
                         f"(known: {', '.join(sorted(KEYS))})")
    for key in ("schedule", "job"):
        if not isinstance(table.get(key), str) or not table[key]:
            raise ValueError(f"{at}: {key} must be a non-empty string, got "
                             f"{table.get(key)!r}")
    options = {k: table[k] for k in ("name", "args", "tz", "queue", "retry", "missed",
                                     "paused") if k in table}
    try:
        return make_entry(table["schedule"], table["job"], **options)
    except PeriodicError as exc:
        raise ValueError(f"{at}: {exc}") from None
