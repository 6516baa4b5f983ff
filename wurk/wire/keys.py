"""Every Redis key name wurk reads or writes, in one place.

The names are Sidekiq's (see the wire-protocol spec) so that Ruby Sidekiq and
its admin tools share state with us. Keys that only wurk uses carry a
``wurk:`` prefix so they can never collide with Sidekiq Pro's own.
"""

from __future__ import annotations

QUEUES = "queues"
PROCESSES = "processes"
SCHEDULE = "schedule"
RETRY = "retry"
DEAD = "dead"
PAUSED = "paused"
STAT_PROCESSED = "stat:processed"
STAT_FAILED = "stat:failed"
PROCESS_CLEANUP_LOCK = "process_cleanup"
LEADER = "dear-leader"
# Sidekiq 8's job profiles: a ZSET of profile keys scored by expiry time.
PROFILES = "profiles"
# Swarm parents (wurk-swarm) register here; each identity is a hash as a process's is.
SWARMS = "wurk:swarms"

# Why an entry of ``dead`` that is not a job (kept byte for byte as it was
# found) is there: a hash from the digest of its bytes to the reason, and the
# same digests scored by time of death, so reasons age out as the set does.
DEAD_NOTES = "wurk:dead:notes"
DEAD_NOTES_AT = "wurk:dead:notes-at"

# Five years, as Sidekiq keeps its per-day counters.
DAILY_STAT_TTL = 157_680_000
# Heartbeat hashes and the signals list live a minute past the last beat.
HEARTBEAT_TTL = 60


def queue(name: str) -> str:
    return f"queue:{name}"


def daily_stat(stat: str, day: str) -> str:
    """``stat:processed:2026-11-30``; ``day`` is a UTC ``YYYY-MM-DD``."""
    return f"stat:{stat}:{day}"


def work_6_4(identity: str) -> str:
    """The in-flight jobs hash as Sidekiq 6.4 names it."""
    return f"{identity}:workers"


def work(identity: str) -> str:
    """The in-flight jobs hash as Sidekiq 6.5 and later name it."""
    return f"{identity}:work"


def signals(identity: str) -> str:
    return f"{identity}-signals"


def profile(token: str, jid: str) -> str:
    """One job's profile HASH, as Sidekiq 8 names it."""
    return f"{token}-{jid}"


# Reliable fetch (wurk's own names; never Sidekiq Pro's ``queue:sq|*``).
WIP_OWNERS = "wurk:wip:owners"
REAPER_LOCK = "wurk:reaper-lock"
# Poison-pill counters live this long after a job's last recovery.
PILL_TTL = 72 * 3600


def wip_prefix(identity: str) -> str:
    return f"wurk:wip:{identity}:"


def wip(identity: str, queue: str) -> str:
    """The private list holding the jobs ``identity`` took from ``queue``."""
    return f"{wip_prefix(identity)}{queue}"


def wip_queues(identity: str) -> str:
    """The set of queue names ``identity`` has private lists for."""
    return f"wurk:wip-queues:{identity}"


PILL_PREFIX = "wurk:pill:"
# Jobs running when their process crashed with evidence against them, that
# have not finished a run since: a sorted set of raw payloads scored by when
# they were accused. Reliable fetch runs each one alone. A mark lives this
# long, so an isolation that never ends (a Ruby process ran the job, a person
# deleted it) cannot hold a queue's head for longer.
SUSPECTS = "wurk:suspects"
SUSPECT_TTL = 3600


def pill(jid: str) -> str:
    return f"{PILL_PREFIX}{jid}"


def pill_arg(jid: str | None) -> str:
    """A job's pill key as a script argument, or "" for none: no jid, or one
    no UTF-8 writer can carry (so no counter can exist under it)."""
    if not jid:
        return ""
    key = pill(jid)
    if not key.isascii():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            return ""
    return key


# Redis's data epoch: a random token set once (SET NX) and never expiring.
# It outlives everything wurk writes, so its absence, or a token other than
# the one a process learned, means Redis lost its data since then (a restart
# without persistence, a failover to an empty replica, FLUSHALL).
EPOCH = "wurk:epoch"
# A failed job settled after its copy was lost with Redis's data leaves a
# marker here, so a replay of that settle writes nothing more.
SETTLED_PREFIX = "wurk:settled:"
SETTLED_TTL = 86_400


# Replica-confirmed pushes: one marker per pushed jid, so a push sent again
# after an unconfirmed WAIT never enqueues the job twice.
PUSHED_PREFIX = "wurk:pushed:"
# Long enough to cover every resend of an unconfirmed push (the push buffer
# gives up at half of it); confirmed pushes retire their markers sooner.
PUSHED_TTL = 3600


def pushed(jid: str) -> str:
    return f"{PUSHED_PREFIX}{jid}"


# Cancel requests for running jobs (``wurk.api.cancel``): a marker per jid,
# value "1" or "kill", that the process running it reads each second. The
# TTL outlives any wait for a busy process to notice; a marker left by a job
# that ended meanwhile costs nothing.
CANCEL_PREFIX = "wurk:cancel:"
CANCEL_TTL = 3600


def cancel(jid: str) -> str:
    return f"{CANCEL_PREFIX}{jid}"


# Plain pushes: one mark per connection, the count of pushes it wrote, so a
# push whose reply was lost can be told landed or not (wurk.push.landing).
PUSH_MARK_PREFIX = "wurk:pushmark:"
# How long after a connection's last push a retry of it is still recognised.
PUSH_MARK_TTL = 3600


def push_mark(token: str) -> str:
    return f"{PUSH_MARK_PREFIX}{token}"


# Leader election (wurk.leader()): one lease STRING per election name and a
# counter its fencing tokens come from. Never Sidekiq Enterprise's
# ``dear-leader``: its value is a bare identity that Ruby processes renew,
# and sharing it would let a Ruby leader stop wurk's leader-only work.
LEADER_PREFIX = "wurk:leader:"
LEADER_COUNTER_PREFIX = "wurk:leader-token:"


def leader_lease(name: str) -> str:
    return f"{LEADER_PREFIX}{name}"


def leader_token(name: str) -> str:
    return f"{LEADER_COUNTER_PREFIX}{name}"


# Periodic jobs, in Sidekiq Enterprise's layout: a set of loop ids, one hash
# per loop, and a capped newest-first history of [fired_at, jid] per loop.
PERIODIC = "periodic"
LOOP_HISTORY_CAP = 25
# A tick's guard outlives any plausible leader hand-over around its tick.
TICK_GUARD_TTL = 86_400


def loop(name: str) -> str:
    return f"loops:{name}"


def loop_history(name: str) -> str:
    return f"loop-history:{name}"


def tick_guard(name: str, tick: int) -> str:
    """Taken (SET NX) by the one process that enqueues this tick."""
    return f"wurk:periodic-tick:{name}:{tick}"
# Limiters (wurk.limiter): the names Sidekiq Enterprise's limiters use, as
# the Ruby ancestor documents them, so one Redis serves both.
LIMITER_LIST = "lmtr-list"
# Every limiter key lives at least this long after its last use (90 days).
LIMITER_TTL = 90 * 86_400


def limiter_meta(name: str) -> str:
    """A limiter's HASH of ``type`` and ``options`` (JSON)."""
    return f"lmtr:{name}"


def limiter_concurrent(name: str) -> str:
    """A concurrent limiter's ZSET of holders, scored by their lease's expiry."""
    return f"lmtr-cs:{name}"


def limiter_stats(name: str) -> str:
    """A concurrent limiter's HASH of counters (``reclaimed``, ``overages``)."""
    return f"lmtr-stats:{name}"


def limiter_window(name: str) -> str:
    """A window limiter's ZSET of admissions, scored by their time."""
    return f"lmtr-w:{name}"


def limiter_bucket(name: str, epoch: int | None = None) -> str:
    """A bucket limiter's counter for one interval (``epoch`` = time // interval),
    or, without an epoch, the prefix the Lua script completes."""
    return f"lmtr-b:{name}" if epoch is None else f"lmtr-b:{name}:{epoch}"


def limiter_leaky(name: str) -> str:
    """A leaky bucket's HASH of ``level`` and ``last``."""
    return f"lmtr-l:{name}"


# A clear in progress (``wurk.api.removal``): the queue or set is renamed to a
# private key, drained a chunk at a time so each job's lock, batch count and
# result land with its removal. This HASH maps each private key to the key it
# was taken from, so a clear cut short (a killed CLI) is finished by the next.
CLEARING = "wurk:clearing"
CLEARING_PREFIX = "wurk:clearing:"
CLEARING_TTL = 86_400  # a private key no clear comes back to goes after this


def clearing(token: str) -> str:
    return f"{CLEARING_PREFIX}{token}"
