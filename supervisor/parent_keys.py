"""The ``[wurk]`` keys only the swarm parent reads, each declared once.

Duties:
1. :data:`PARENT_KEYS`: each key with its type, default, range and help, in
   the form of :mod:`wurk.settings.declared` (no environment variable, no
   ``wurk run`` flag: only a topology file sets them). The
   :class:`supervisor.topology.Topology` fields, the topology's range checks
   and the swarm section of ``docs/reference/settings.md`` come from it.
2. :data:`SLOT_PARENT_KEYS`: those a ``[[slot]]`` may set for itself.
3. :func:`reference_section`: that section of the reference page.
"""

from __future__ import annotations

from wurk.settings.bounds import Range
from wurk.settings.declaration import Setting
from wurk.settings.reference import settings_table

# The most children one slot may have (its count, and TTIN's ceiling).
MAX_CHILDREN = 1000
# A child silent this long is hung; the default is gunicorn's timeout, and
# never under CHILD_TIMEOUT_BEATS heartbeat intervals.
CHILD_TIMEOUT_DEFAULT = 30.0
CHILD_TIMEOUT_BEATS = 6
# child_timeout must leave room for at least this many heartbeats.
CHILD_TIMEOUT_MIN_BEATS = 2
# A slot's TTIN ceiling, unless set: this many times its count.
MAX_COUNT_FACTOR = 4

_PARENT = "../how-to/swarm.md#what-the-parent-does"

PARENT_KEYS: tuple[Setting, ...] = (
    Setting("max_memory_mb", "int", 0, range=Range(0, 1_048_576), from_env=False,
            shown_default="0 (no limit)",
            help="a child whose RSS exceeds this is drained and replaced; a slot may set "
                 "its own"),
    Setting("respawn_backoff_max", "float", 30.0, range=Range(0, 3600), from_env=False,
            help="longest pause, in seconds, before respawning a slot whose children keep "
                 "crashing"),
    Setting("boot_failure_limit", "int", 3, range=Range(1, 1000), from_env=False,
            help="children of one slot in a row that fail to boot (exit 69: their modules "
                 "cannot be imported, or Redis refuses their credentials) make the swarm give "
                 "up (exit 69); a child waiting for an unreachable Redis is not failing"),
    Setting("shutdown_grace", "float", 5.0, range=Range(0, 3600), from_env=False,
            help="seconds the parent waits past `shutdown_timeout` before it KILLs a draining "
                 "child"),
    Setting("memory_check_interval", "float", 5.0, range=Range(0, 3600), from_env=False,
            help="seconds between RSS checks (each check is jittered by ±20%)"),
    Setting("gc_freeze", "bool", True, from_env=False,
            limit="`true`, `false`",
            help="`gc.freeze()` the preloaded heap before each fork, so children share it "
                 "copy-on-write (their garbage collections never write to the shared pages)"),
    # Unset: worked out per slot (Slot.child_timeout, Slot.max_count).
    Setting("child_timeout", "float | None", None, range=Range(0.1, 86_400), from_env=False,
            shown_default=f"{CHILD_TIMEOUT_DEFAULT:g}, or {CHILD_TIMEOUT_BEATS} "
                          "`heartbeat_interval`s if longer",
            limit=f"{CHILD_TIMEOUT_MIN_BEATS} `heartbeat_interval`s to 86400",
            help="seconds a ready child may go without a liveness pulse before the parent "
                 f"KILLs it as hung and replaces it (see [What the parent does]({_PARENT})); "
                 "a slot may set its own"),
    Setting("max_count", "int | None", None, range=Range(1, MAX_CHILDREN), from_env=False,
            shown_default=f"{MAX_COUNT_FACTOR} \N{MULTIPLICATION SIGN} the slot's `count` "
                          f"(at most {MAX_CHILDREN})",
            limit=f"the slot's `count` to {MAX_CHILDREN}",
            help="most children TTIN (a signal or a remote one) gives a slot; a slot may set "
                 "its own"),
)

# Parent-only keys a slot may set for itself, over the [wurk] value.
SLOT_PARENT_KEYS = ("max_memory_mb", "child_timeout", "max_count")

SECTION_INTRO = """\
## The swarm parent's keys

A topology file's `[wurk]` table (see [topology.md](topology.md)) takes every
key above, which every child gets, plus these keys that only the parent
reads. They come from the file alone: no variable or flag sets them, and
`wurk run -C` rejects them as unknown.
"""


def reference_section() -> str:
    table = settings_table(PARENT_KEYS, environment=False, flags=False)
    return SECTION_INTRO + "\n" + table
