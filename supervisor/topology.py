"""The topology file: which slots a swarm runs and how.

Duties:
1. Read a TOML file with a ``[wurk]`` table (shared settings, the same keys
   ``wurk run --config`` reads, plus swarm-only ones) and ``[[slot]]`` tables.
2. Validate everything before anything forks, raising :class:`TopologyError`
   whose message names the file, the key and the bad value; the CLI turns it
   into exit status 78 (EX_CONFIG).
3. Build one :class:`wurk.config.Config` per slot, with the slot's queues,
   concurrency and overrides applied.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wurk.config import Config, ConfigError
from wurk.health import parse_listen
from wurk.queues import QueueSpecError, parse_queue

# [wurk] keys only the swarm reads (the rest go to each child's Config).
SWARM_KEYS = {"max_memory_mb", "respawn_backoff_max", "boot_failure_limit",
              "shutdown_grace", "memory_check_interval", "gc_freeze"}
SLOT_KEYS = {"name", "count", "concurrency", "queues", "redis_url", "max_memory_mb",
             "require", "env", "tag", "shutdown_timeout", "health_listen"}


class TopologyError(ValueError):
    """The topology file cannot be used; the message names file, key and value."""


@dataclass(frozen=True)
class Slot:
    name: str
    count: int
    config: Config
    max_memory_mb: int = 0
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Topology:
    path: Path
    base: Config
    slots: tuple[Slot, ...]
    max_memory_mb: int = 0
    # Longest pause between respawns of a crash-looping slot.
    respawn_backoff_max: float = 30.0
    # Children in a row that die before ever becoming ready make the swarm give up.
    boot_failure_limit: int = 3
    # Added to shutdown_timeout before the parent KILLs a draining child.
    shutdown_grace: float = 5.0
    memory_check_interval: float = 5.0
    # Freeze the preloaded heap before forking, so the children's garbage
    # collections never write to (and so never copy) the shared pages.
    gc_freeze: bool = True

    @property
    def shutdown_timeout(self) -> float:
        return max(slot.config.shutdown_timeout for slot in self.slots)


def load(path: str | Path) -> Topology:
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read the topology file: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TopologyError(f"{path}: invalid TOML: {exc}") from None
    return parse(document, path)


def parse(document: dict[str, Any], path: Path) -> Topology:
    where = str(path)
    extra = set(document) - {"wurk", "slot"}
    if extra:
        raise TopologyError(f"{where}: unknown key {sorted(extra)[0]!r} at the top level")
    table = _table(document.get("wurk", {}), where, "wurk")
    swarm = {k: table.pop(k) for k in list(table) if k in SWARM_KEYS}
    base = _config(table, f"{where}: [wurk]")
    slots_raw = document.get("slot")
    if not isinstance(slots_raw, list) or not slots_raw:
        raise TopologyError(f"{where}: slot must be one or more [[slot]] tables, got "
                            f"{slots_raw!r}")
    slots = tuple(_slot(raw, i, table, where) for i, raw in enumerate(slots_raw))
    names = [s.name for s in slots]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise TopologyError(f"{where}: slot.name {duplicate!r} is used by more than one slot")
    _check_health_ports(slots, where)
    topology = Topology(path, base, slots, **_swarm_settings(swarm, where))
    return _with_memory_defaults(topology)


def _table(value: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TopologyError(f"{where}: {key} must be a table, got {value!r}")
    return dict(value)


def _config(values: dict[str, Any], where: str) -> Config:
    try:
        return Config.from_mapping(values, source=where)
    except ConfigError as exc:
        raise TopologyError(str(exc)) from None


def _swarm_settings(values: dict[str, Any], where: str) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for key, value in values.items():
        if key == "gc_freeze":
            if not isinstance(value, bool):
                raise TopologyError(f"{where}: [wurk] gc_freeze must be true or false, "
                                    f"got {value!r}")
            settings[key] = value
            continue
        integral = key in ("max_memory_mb", "boot_failure_limit")
        ok_type = isinstance(value, int) if integral else isinstance(value, int | float)
        # NaN passes a "< 0" test and would make every deadline unreachable.
        if isinstance(value, bool) or not ok_type or math.isnan(value) or value < 0:
            kind = "a non-negative integer" if integral else "a non-negative number"
            raise TopologyError(f"{where}: [wurk] {key} must be {kind}, got {value!r}")
        settings[key] = value
    if settings.get("boot_failure_limit") == 0:
        raise TopologyError(f"{where}: [wurk] boot_failure_limit must be at least 1, got 0")
    return settings


def _slot(raw: Any, index: int, shared: dict[str, Any], where: str) -> Slot:
    at = f"{where}: slot[{index}]"
    table = _table(raw, at, "slot")
    unknown = sorted(set(table) - SLOT_KEYS)
    if unknown:
        raise TopologyError(f"{at}: unknown key {unknown[0]!r}")
    name = table.pop("name", None)
    if not isinstance(name, str) or not name.strip():
        raise TopologyError(f"{at}: name must be a non-empty string, got {name!r}")
    at = f"{where}: slot {name!r}"
    count = table.pop("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise TopologyError(f"{at}: count must be an integer of at least 1, got {count!r}")
    memory = table.pop("max_memory_mb", None)
    env = table.pop("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise TopologyError(f"{at}: env must be a table of strings, got {env!r}")
    _check_queues(table.get("queues"), at)
    config = _config({**shared, **table}, at)
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)
                               or memory < 0):
        raise TopologyError(f"{at}: max_memory_mb must be a non-negative integer, got {memory!r}")
    return Slot(name, count, config, -1 if memory is None else memory, dict(env))


def _check_health_ports(slots: tuple[Slot, ...], where: str) -> None:
    """A fixed health port is a base: child N listens on base + N, so ranges must not meet."""
    taken: dict[int, str] = {}
    for slot in slots:
        if slot.config.health_listen is None:
            continue
        _, base = parse_listen(slot.config.health_listen)
        for port in range(base, base + slot.count) if base else ():
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
        raise TopologyError(f"{at}: queues must be a non-empty list of strings, got {queues!r}")
    for spec in queues:
        if not isinstance(spec, str):
            raise TopologyError(f"{at}: queues must be a list of strings, got {queues!r}")
        try:
            parse_queue(spec)
        except QueueSpecError as exc:
            raise TopologyError(f"{at}: queues {exc}") from None


def _with_memory_defaults(topology: Topology) -> Topology:
    """A slot without its own max_memory_mb takes the [wurk] one."""
    slots = tuple(
        Slot(s.name, s.count, s.config,
             topology.max_memory_mb if s.max_memory_mb < 0 else s.max_memory_mb, s.env)
        for s in topology.slots
    )
    return Topology(topology.path, topology.base, slots, topology.max_memory_mb,
                    topology.respawn_backoff_max, topology.boot_failure_limit,
                    topology.shutdown_grace, topology.memory_check_interval,
                    topology.gc_freeze)

