"""The topology file: which slots a swarm runs and how.

Duties:
1. Read a TOML file with a ``[wurk]`` table (shared settings, the same keys
   ``wurk run --config`` reads, plus swarm-only ones), ``[[slot]]`` tables
   and ``[[periodic]]`` tables (:mod:`supervisor.topology_periodic`).
2. Validate everything before anything forks, raising :class:`TopologyError`
   whose one-line message names the file, the table or slot, the key and the
   bad value; the CLI turns it into exit status 78 (EX_CONFIG). Every number
   the parent reads has a documented range (:data:`RANGES`, from the
   declarations in :mod:`supervisor.parent_keys`), and the
   settings the parent relies on in each slot's config (concurrency,
   shutdown_timeout) are bounded here too.
3. Build one :class:`wurk.settings.config.Config` per slot, with the slot's queues,
   concurrency and overrides applied, and resolve each slot's parent-only
   settings (its own, else the ``[wurk]`` one, else the default).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from supervisor.parent_keys import (
    CHILD_TIMEOUT_BEATS,
    CHILD_TIMEOUT_DEFAULT,
    CHILD_TIMEOUT_MIN_BEATS,
    MAX_CHILDREN,
    MAX_COUNT_FACTOR,
    PARENT_KEYS,
    SLOT_PARENT_KEYS,
)
from supervisor.topology_periodic import parse_periodic
from wurk.core.suggest import did_you_mean
from wurk.core.validate import is_number, is_whole
from wurk.push.periodic import PeriodicEntry
from wurk.redis.runtime import Runtime, runtime_for
from wurk.settings.addresses import parse_listen
from wurk.settings.bounds import Range
from wurk.settings.config import Config, ConfigError
from wurk.settings.declaration import DECLARED, config_fields
from wurk.settings.declared import RANGES as CONFIG_RANGES
from wurk.settings.files import SettingsFileError, read_settings_file
from wurk.settings.queues import QueueSpecError, parse_queue
from wurk.settings.values import environment_layer

# Numeric settings the parent reads: key -> (integral, lowest, highest); the
# parent's own keys as declared in supervisor.parent_keys.
RANGES: dict[str, tuple[bool, float, float]] = {
    "count": (True, 1, MAX_CHILDREN),
    **{k.name: (int in k.types and float not in k.types, k.range.low, k.range.high)
       for k in PARENT_KEYS if k.range is not None},
    # Slot Config values the parent relies on: its thread count and drain deadline.
    **{key: (key == "concurrency", CONFIG_RANGES[key].low, CONFIG_RANGES[key].high)
       for key in ("concurrency", "shutdown_timeout")},
}
TOP_KEYS = {"wurk", "slot", "periodic"}
# [wurk] keys only the swarm reads (the rest go to each child's Config).
SWARM_KEYS = {k.name for k in PARENT_KEYS}
SLOT_KEYS = {"name", "count", "concurrency", "executor", "executor_threads", "queues",
             "redis_url", "require", "env", "tag", "shutdown_timeout", "health_listen",
             "max_jobs", "max_jobs_jitter",
             *SLOT_PARENT_KEYS}


class TopologyError(ValueError):
    """The topology file cannot be used; the message names file, key and value."""


@dataclass(frozen=True)
class Slot:
    name: str
    count: int
    config: Config
    max_memory_mb: int = 0
    env: dict[str, str] = field(default_factory=dict)
    # Seconds without a pulse from a ready child before the parent KILLs it as hung.
    child_timeout: float = CHILD_TIMEOUT_DEFAULT
    # TTIN (a signal or a remote one) never takes the slot above this many children.
    max_count: int = MAX_CHILDREN

    @cached_property
    def runtime(self) -> Runtime:
        """This process's runtime for the slot's config: its pools, for the parent's
        reads of the slot's children and for the child it boots; looked up once."""
        return runtime_for(self.config)


@dataclass(frozen=True)
@config_fields(PARENT_KEYS, own=("path", "base", "slots", "periodic"))
class Topology:
    """The parsed file; the parent's own settings are declared in supervisor.parent_keys."""

    path: Path
    base: Config
    slots: tuple[Slot, ...]
    # [[periodic]] entries (supervisor.topology_periodic): the parent runs them.
    periodic: tuple[PeriodicEntry, ...] = ()
    max_memory_mb: int = DECLARED
    respawn_backoff_max: float = DECLARED
    boot_failure_limit: int = DECLARED
    shutdown_grace: float = DECLARED
    memory_check_interval: float = DECLARED
    gc_freeze: bool = DECLARED
    # Slot defaults for the keys of SLOT_PARENT_KEYS (None: computed per slot).
    child_timeout: float | None = DECLARED
    max_count: int | None = DECLARED

    @property
    def shutdown_timeout(self) -> float:
        return max(slot.config.shutdown_timeout for slot in self.slots)


def load(path: str | Path, *, defaults: Mapping[str, Any] | None = None,
         defaults_source: str = "defaults") -> Topology:
    """``defaults``: settings under the file's ``[wurk]`` table and over the
    environment (a framework's own, such as Django's ``settings.WURK``); an
    error in one names ``defaults_source``."""
    path = Path(path)
    try:
        document = tomllib.loads(read_settings_file(path))
    except SettingsFileError as exc:
        raise TopologyError(f"{path}: cannot read the topology file: {exc}") from None
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read the topology file: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: invalid TOML: {exc}") from None
    return parse(document, path, defaults=defaults, defaults_source=defaults_source)


def parse(document: dict[str, Any], path: Path, env: Mapping[str, str] | None = None, *,
          defaults: Mapping[str, Any] | None = None,
          defaults_source: str = "defaults") -> Topology:
    """``env`` (default: this process's) gives ``REDIS_URL`` and ``WURK_*``
    values under the file's: the file wins, as with ``wurk run -C``."""
    where = str(path)
    extra = set(document) - TOP_KEYS
    if extra:
        key = sorted(extra)[0]
        raise TopologyError(f"{where}: unknown key {key!r} at the top level"
                            f"{did_you_mean(key, TOP_KEYS)}")
    table = _table(document.get("wurk", {}), where, "wurk")
    swarm = {k: table.pop(k) for k in list(table) if k in SWARM_KEYS}
    try:
        environment, env_sources = environment_layer(os.environ if env is None else env)
    except ConfigError as exc:
        raise TopologyError(f"{where}: {exc}") from None
    # Errors about a value the environment gave name its variable, not the file.
    given = dict(defaults or {})
    sources = {k: v for k, v in env_sources.items() if k not in table and k not in given}
    sources.update((k, defaults_source) for k in given if k not in table)
    table = {**environment, **given, **table}
    base = _config(table, f"{where}: [wurk]", sources)
    slots_raw = document.get("slot")
    if not isinstance(slots_raw, list) or not slots_raw:
        raise TopologyError(f"{where}: slot must be one or more [[slot]] tables, got "
                            f"{slots_raw!r}")
    try:
        periodic = parse_periodic(document.get("periodic"), where)
    except ValueError as exc:
        raise TopologyError(str(exc)) from None
    topology = Topology(path, base, (), periodic=periodic, **_swarm_settings(swarm, where))
    slots = tuple(_slot(raw, i, table, sources, topology=topology, where=where)
                  for i, raw in enumerate(slots_raw))
    names = [s.name for s in slots]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise TopologyError(f"{where}: slot.name {duplicate!r} is used by more than one slot")
    _check_health_ports(slots, where)
    return replace(topology, slots=slots)


def _table(value: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TopologyError(f"{where}: {key} must be a table, got {value!r}")
    return dict(value)


def _config(values: dict[str, Any], where: str, sources: Mapping[str, str]) -> Config:
    try:
        return Config.from_mapping(values, source=where, sources=sources, known=SWARM_KEYS)
    except ConfigError as exc:
        raise TopologyError(str(exc)) from None


def check_range(key: str, value: Any, at: str) -> None:
    """Raise naming ``at``, the key and the value unless it is a number in RANGES[key]."""
    integral, low, high = RANGES[key]
    kind = "an integer" if integral else "a number"
    ok_type = is_whole(value) if integral else is_number(value)
    # NaN fails every comparison, and inf would make a deadline unreachable or
    # overflow a wait; "not low <= value <= high" refuses both.
    if not ok_type or not low <= value <= high:
        raise TopologyError(f"{at} {key} must be {kind} from {Range(low, high).describe()}, "
                            f"got {value!r}")


def _swarm_settings(values: dict[str, Any], where: str) -> dict[str, Any]:
    for key, value in values.items():
        if key == "gc_freeze":
            if not isinstance(value, bool):
                raise TopologyError(f"{where}: [wurk] gc_freeze must be true or false, "
                                    f"got {value!r}")
        else:
            check_range(key, value, f"{where}: [wurk]")
    return values


def _slot(raw: Any, index: int, shared: dict[str, Any], sources: Mapping[str, str], *,
          topology: Topology, where: str) -> Slot:
    at = f"{where}: slot[{index}]"
    table = _table(raw, at, "slot")
    unknown = sorted(set(table) - SLOT_KEYS)
    if unknown:
        raise TopologyError(f"{at}: unknown key {unknown[0]!r}"
                            f"{did_you_mean(unknown[0], SLOT_KEYS)}")
    name = table.pop("name", None)
    if not isinstance(name, str) or not name.strip():
        raise TopologyError(f"{at}: name must be a non-empty string, got {name!r}")
    at = f"{where}: slot {name!r}:"
    count = table.pop("count", 1)
    check_range("count", count, at)
    own = {k: table.pop(k) for k in SLOT_PARENT_KEYS if k in table}
    for key, value in own.items():
        check_range(key, value, at)
    env = _env(table.pop("env", {}), at)
    _check_queues(table.get("queues"), at)
    config = _config({**shared, **table}, at.rstrip(":"),
                     {k: v for k, v in sources.items() if k not in table})
    for key in ("concurrency", "shutdown_timeout"):
        # Name where the value came from: the slot's own table, or [wurk].
        check_range(key, getattr(config, key), at if key in table else f"{where}: [wurk]")
    slot = Slot(name, count, config, env=env)
    return _resolve(slot, own, topology, at)


def _env(env: Any, at: str) -> dict[str, str]:
    """Variables os.environ can take: a bad one would crash every child at boot."""
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise TopologyError(f"{at} env must be a table of strings, got {env!r}")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise TopologyError(f"{at} env key {key!r} must be non-empty, without '=' or NUL")
        if "\0" in value:
            raise TopologyError(f"{at} env {key} must not contain NUL, got {value!r}")
    return dict(env)


def _resolve(slot: Slot, own: dict[str, Any], topology: Topology, at: str) -> Slot:
    """The slot's own parent-only settings, else [wurk]'s, else the defaults; then checked
    against the slot's count and heartbeat."""
    def pick(key: str, default: Any) -> Any:
        shared = getattr(topology, key)
        return own.get(key, default if shared is None else shared)

    beat = slot.config.heartbeat_interval
    resolved = replace(
        slot, max_memory_mb=pick("max_memory_mb", 0),
        child_timeout=pick("child_timeout", max(CHILD_TIMEOUT_DEFAULT, CHILD_TIMEOUT_BEATS * beat)),
        max_count=pick("max_count", min(MAX_CHILDREN, MAX_COUNT_FACTOR * slot.count)))
    if resolved.max_count < slot.count:
        raise TopologyError(f"{at} max_count must be at least the slot's count ({slot.count}), "
                            f"got {resolved.max_count!r}")
    if resolved.child_timeout < CHILD_TIMEOUT_MIN_BEATS * beat:
        raise TopologyError(
            f"{at} child_timeout must be at least {CHILD_TIMEOUT_MIN_BEATS} heartbeat_intervals "
            f"({CHILD_TIMEOUT_MIN_BEATS * beat:g} s), got {resolved.child_timeout!r}")
    return resolved


def _check_health_ports(slots: tuple[Slot, ...], where: str) -> None:
    """A fixed health port is a base: child N listens on base + N, so ranges must not meet,
    up to the slot's max_count (TTIN adds children at the next indexes)."""
    taken: dict[int, str] = {}
    for slot in slots:
        if slot.config.health_listen is None:
            continue
        _, base = parse_listen(slot.config.health_listen)
        for port in range(base, base + slot.max_count) if base else ():
            owner = taken.setdefault(port, slot.name)
            if port > 65535 or owner != slot.name:
                clash = "exceeds 65535" if port > 65535 else f"is also slot {owner!r}'s"
                raise TopologyError(
                    f"{where}: slot {slot.name!r}: health_listen {slot.config.health_listen!r} "
                    f"gives child #{port - base} port {port}, which {clash}; give each slot "
                    "its own base port or use port 0")


def _check_queues(queues: Any, at: str) -> None:
    if queues is None:
        return
    if not isinstance(queues, list) or not queues:
        raise TopologyError(f"{at} queues must be a non-empty list of strings, got {queues!r}")
    for spec in queues:
        if not isinstance(spec, str):
            raise TopologyError(f"{at} queues must be a list of strings, got {queues!r}")
        try:
            parse_queue(spec)
        except QueueSpecError as exc:
            raise TopologyError(f"{at} queues {exc}") from None
