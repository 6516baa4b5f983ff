"""Every setting, declared once.

Duties:
1. :data:`SETTINGS`: each ``[wurk]`` key in the order of
   :class:`wurk.settings.config.Config`'s attributes, with its type, default,
   range or choices, help, environment variable and ``wurk run`` flag. The
   Config fields, the environment's coercion, type and range checks, the
   ``wurk run`` options and ``docs/reference/settings.md`` all come from it.
2. :data:`HOOKS`: the code-only settings (Python callables).
3. :data:`RANGES`, :data:`BY_NAME`: the table looked up by name.

Help is Markdown for the reference page; links are relative to
``docs/reference/``.
"""

from __future__ import annotations

import os

from wurk.settings.bounds import (
    DAY,
    HOUR,
    MAX_BUFFERED_PUSHES,
    MAX_CONCURRENCY,
    MAX_DEAD_JOBS,
    MAX_HEARTBEAT_INTERVAL,
    MAX_JOBS_PER_PROCESS,
    MAX_POOL_SIZE,
    MAX_QUEUE_WEIGHT,
    MAX_RECOVERIES,
    MAX_REDIS_ATTEMPTS,
    MAX_REDIS_TIMEOUT,
    MAX_REPLICAS,
    MAX_RETRIES,
    MAX_TIMEOUT,
    MIN_INTERVAL,
    MINUTE,
    WEEK,
    YEAR,
    Range,
)
from wurk.settings.declaration import Flag, Hook, Setting
from wurk.settings.redis_url import MAX_PORT

DEFAULT_REDIS_URL = "redis://localhost:6379/0"

_RELIABLE = "../explanation/delivery-guarantees.md"
_DEAD_TIMEOUT = 180 * DAY


def _redis_url_default() -> str:
    # A Config built in code, not through Config.load, still honours REDIS_URL.
    return os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)


SETTINGS: tuple[Setting, ...] = (
    Setting("redis_url", "str", DEFAULT_REDIS_URL, factory=_redis_url_default,
            also_env=("REDIS_URL",),
            limit="see [AUTH and TLS](configuration.md#redis-auth-and-tls)",
            flag=Flag(("--redis-url",), metavar="URL",
                      help="Redis to use (default: the config's, WURK_REDIS_URL, REDIS_URL, "
                           "or localhost)"),
            help="where Redis is; with Sentinel, only the db, username and password are used"),
    Setting("sentinels", "list[str]", [], limit=f"port 1 to {MAX_PORT}",
            help="Redis Sentinel addresses, `host:port` each (see "
                 "[Redis Sentinel](../how-to/reliability.md#redis-sentinel)); the URL then "
                 "only gives the db number, username and password"),
    Setting("sentinel_master", "str | None", None,
            help="the master name the sentinels know; set exactly when `sentinels` is"),
    Setting("sentinel_password", "str | None", None, secret=True,
            help="password for the sentinels themselves"),
    Setting("concurrency", "int", 10, range=Range(1, MAX_CONCURRENCY),
            flag=Flag(("-c", "--concurrency"), help="worker threads (default {default})"),
            help="jobs at once in one `wurk run` process or swarm child (a thread each with "
                 "the threads executor)"),
    Setting("executor", "str", "threads", choices=("threads", "asyncio"),
            flag=Flag(("--executor",), help="{choices} (default {default})"),
            help='`"threads"`: one thread per concurrent job; `"asyncio"`: one event loop runs '
                 "up to `concurrency` jobs at once, `async def` jobs as tasks and sync ones in "
                 "a pool of `executor_threads` (see [Async jobs](../how-to/async-jobs.md"
                 "#the-asyncio-executor))"),
    Setting("executor_threads", "int | None", None, range=Range(1, MAX_CONCURRENCY),
            shown_default="unset (the smaller of concurrency and 16)",
            help='with `executor = "asyncio"`, threads that run sync jobs (and sync server '
                 "middleware around async jobs)"),
    Setting("queues", "list[str]", ["default"], limit=f"weight 0 to {MAX_QUEUE_WEIGHT}",
            flag=Flag(("-q", "--queue"),
                      help="queue to poll, NAME or NAME:WEIGHT; repeatable, in priority order"),
            help="queues to poll, `NAME` or `NAME:WEIGHT`; with weights, each fetch polls a "
                 "queue first with a chance proportional to its weight"),
    Setting("require", "list[str]", [],
            flag=Flag(("-r", "--require"),
                      help="module (or .py file) that defines jobs; repeatable"),
            help="modules or `.py` files that define jobs (a file imports under its "
                 "package's dotted name, as `src/myapp/jobs.py` is `myapp.jobs`)"),
    Setting("shutdown_timeout", "float", 25.0, range=Range(0, MAX_TIMEOUT),
            flag=Flag(("-t", "--timeout"), help="shutdown timeout in seconds"),
            help="seconds running jobs get to finish after TERM; giving back and the last "
                 "Redis writes then get at most one more second"),
    Setting("max_jobs", "int | None", None, range=Range(1, MAX_JOBS_PER_PROCESS),
            shown_default="unset (never)",
            flag=Flag(("--max-jobs",), metavar="N",
                      help="stop after about N jobs so that a fresh process takes over "
                           "(exit status 75; default: never)"),
            help="a `wurk run` process or swarm child that has finished this many jobs (plus "
                 "its `max_jobs_jitter` draw) stops as `TERM` stops it: no more fetches, "
                 "running jobs finish; a swarm forks a fresh child in its place, `wurk run` "
                 "exits 75 for its process manager to start it again (see [Recycling by "
                 "count](../how-to/swarm.md#recycling-by-count)); an embedded worker "
                 "ignores it"),
    Setting("max_jobs_jitter", "int | None", None, range=Range(0, MAX_JOBS_PER_PROCESS),
            shown_default="unset (a tenth of `max_jobs`)",
            help="each process adds a random 0 to this many jobs to its `max_jobs`, so "
                 "children started together do not all recycle together"),
    Setting("tag", "str", "",
            flag=Flag(("-g", "--tag"), help="a tag shown in the process list"),
            help="a tag shown in the process list and Sidekiq's UI"),
    Setting("labels", "list[str]", [], help="labels shown in Sidekiq's UI"),
    Setting("timestamps", "str", "float", choices=("float", "ms"),
            help='`"float"` writes epoch seconds with a fraction (read by Sidekiq 6.4 to 8); '
                 '`"ms"` writes Sidekiq 8\'s integer milliseconds'),
    Setting("max_retries", "int", 25, range=Range(0, MAX_RETRIES),
            help="retries for a job whose `retry` option is `true`"),
    Setting("dead_max_jobs", "int", 10_000, range=Range(0, MAX_DEAD_JOBS),
            help="the dead set keeps at most this many jobs"),
    Setting("dead_timeout", "float", float(_DEAD_TIMEOUT), range=Range(0, 10 * YEAR),
            shown_default=f"{_DEAD_TIMEOUT} (180 days)",
            help="seconds a job stays in the dead set"),
    Setting("batch_linger", "int", DAY, range=Range(1, 90 * DAY),
            shown_default=f"{DAY} (1 day)",
            help="seconds a batch whose `success` fired, and a finished workflow, are kept "
                 "for the status API; then their keys, fired markers and index entries go"),
    Setting("average_scheduled_poll_interval", "float", 5.0, range=Range(MIN_INTERVAL, DAY),
            help="the whole cluster checks for due scheduled jobs and retries about once per "
                 "this many seconds"),
    Setting("poll_interval_average", "float | None", None, range=Range(MIN_INTERVAL, DAY),
            help="if set, every process checks about this often, starting at once (handy in "
                 "tests and demos)"),
    Setting("heartbeat_interval", "float", 5.0,
            range=Range(MIN_INTERVAL, MAX_HEARTBEAT_INTERVAL),
            help="seconds between heartbeats (process registration and stats flush)"),
    Setting("fetch_timeout", "float", 2.0, range=Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
            help="seconds one blocking fetch waits for a job"),
    Setting("reliable_fetch", "bool", True,
            help="keep each claimed job in a private list in Redis until it is acknowledged, "
                 f"so a killed process loses nothing (see [Reliable fetch]({_RELIABLE}"
                 "#reliable-fetch))"),
    Setting("reliable_poll_interval", "float", 0.25,
            range=Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
            help="with several queues and all of them empty, seconds the fetcher blocks on the "
                 "first queue before looking at the others again"),
    Setting("reliable_push", "bool", True,
            help="keep pushes that provably did not reach Redis in memory, in order, and send "
                 "them when it returns"),
    Setting("push_buffer_size", "int", 10_000, range=Range(1, MAX_BUFFERED_PUSHES),
            help="most jobs that wait in that buffer; one more raises "
                 "`wurk.PushBufferFullError`"),
    Setting("push_flush_timeout", "float", 5.0, range=Range(0, HOUR),
            help="seconds a process tries, at exit, to send what is still buffered"),
    Setting("push_replicas", "int | None", None, range=Range(0, MAX_REPLICAS),
            shown_default="unset: 1 with `sentinels`, else 0",
            help="when above 0, a push counts only once this many replicas confirm it "
                 "(`WAIT`), which closes the window in which a failover drops a push the "
                 f"primary had accepted; see [Confirmed pushes]({_RELIABLE}#confirmed-pushes)"),
    Setting("push_replicas_timeout", "float", 1.0, range=Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
            help="seconds each push waits for those replicas before it is sent again "
                 "(buffered) or fails with `wurk.PushNotConfirmedError`"),
    Setting("spool_dir", "str | None", None,
            shown_default="unset: `$XDG_STATE_HOME/wurk/spool`, else `~/.local/state/wurk/spool`",
            help="where a process writes, at exit, the pushes it could not send, and where "
                 f"wurk processes look for them (see [Reliable push]({_RELIABLE}"
                 "#reliable-push)); a local directory"),
    # wurk.push.spool_drain never waits longer than an hour between looks.
    Setting("spool_interval", "float", 10.0, range=Range(MIN_INTERVAL, HOUR),
            help="seconds between a `wurk run` process's (or swarm child's) looks into "
                 "`spool_dir`"),
    Setting("reliable_scheduler", "bool", True,
            help="move due scheduled jobs and retries inside one Lua script (no pop-then-push "
                 "window); `false` keeps Sidekiq's pop-then-push"),
    Setting("reaper_interval", "float", 60.0, range=Range(MIN_INTERVAL, DAY),
            help="seconds between one process's sweeps for dead processes' private lists"),
    Setting("max_recoveries", "int", 3, range=Range(0, MAX_RECOVERIES),
            help="a job that crashed its swarm child (a SIGSEGV, a SIGABRT, a memory recycle) "
                 "as the only job it ran more often than this goes to the dead set as a "
                 f"poison pill; a SIGKILL never counts (see [Reliable fetch]({_RELIABLE}"
                 "#reliable-fetch))"),
    Setting("redis_pool_size", "int | None", None, range=Range(1, MAX_POOL_SIZE),
            shown_default="unset (concurrency + 6; with the asyncio executor, its threads + 6)",
            help="Redis connections per process"),
    Setting("redis_connect_timeout", "float", 1.0, range=Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
            help="seconds to connect to Redis, TLS handshake included"),
    Setting("redis_read_timeout", "float", 2.5, range=Range(MIN_INTERVAL, MAX_REDIS_TIMEOUT),
            help="seconds to wait for a Redis reply"),
    Setting("redis_retry_attempts", "int", 4, range=Range(1, MAX_REDIS_ATTEMPTS),
            help="attempts for a Redis operation that is safe to retry"),
    Setting("redis_retry_base", "float", 0.5, range=Range(0, MAX_REDIS_TIMEOUT),
            help="first backoff delay between those attempts, in seconds"),
    Setting("redis_retry_cap", "float", 4.0, range=Range(MIN_INTERVAL, 10 * MINUTE),
            help="longest backoff delay, in seconds"),
    Setting("log_level", "str", "info",
            choices=("debug", "info", "warning", "error", "critical"),
            flag=Flag(("--log-level",), help="{choices}"),
            help="the least severe log events written; read by wurk's entry points only"),
    Setting("log_format", "str", "auto", choices=("auto", "json", "console"),
            help="`json`, `console`, or `auto` (console on a terminal, JSON lines otherwise); "
                 "read by wurk's entry points only"),
    Setting("profile_ttl", "int", DAY, range=Range(1, WEEK),
            help="seconds a job's profile stays in Redis (Sidekiq 8: one day; see "
                 "[Profiles, metrics and health probes](observability.md))"),
    Setting("metrics_url", "str | None", None, limit=f"port 1 to {MAX_PORT}",
            help="`udp://host:port` of a statsd or DogStatsD agent; unset sends no metrics"),
    Setting("metrics_dogstatsd", "bool", False,
            help="send tags DogStatsD's way (`|#class:X,queue:Y`) instead of folding them "
                 "into metric names"),
    Setting("metrics_prometheus", "bool", False,
            help="keep in-process totals and serve them on the health listener's "
                 "`GET /metrics` (needs `health_listen`)"),
    Setting("class_metrics", "bool", True,
            help="record executions, failures and run times per job class in memory and "
                 "write them once per heartbeat in Sidekiq's metrics keys (the "
                 "dashboard's Metrics page; Sidekiq's Web reads them too)"),
    Setting("class_metrics_format", "str", "sidekiq8", choices=("sidekiq8", "sidekiq7"),
            help="the keys `class_metrics` writes: `sidekiq8` (Sidekiq 8's: a hash per minute "
                 "kept 8 hours and one per 10 minutes kept 3 days, which the dashboard's "
                 "longer windows read; Sidekiq 8's Web shows them) or `sidekiq7` (Sidekiq "
                 "7's: a hash per minute only; Sidekiq 7's Web shows them); the dashboard "
                 "reads both, see [the key names](redis-format.md#per-class-execution-metrics)"),
    Setting("health_listen", "str | None", None, limit=f"port 0 to {MAX_PORT}",
            help="`host:port` (or `:port`) of an HTTP listener for `/live` and `/ready`; "
                 "without a host it binds 127.0.0.1; port 0 picks one; swarm child N listens "
                 "on port + N (per-slot `health_listen` allowed)"),
    Setting("web_user", "str | None", None,
            help="user name `wurk web` asks for with HTTP basic auth; set it together with "
                 "`web_password` (see [The web dashboard](../how-to/dashboard.md))"),
    Setting("web_password", "str | None", None, secret=True,
            help="password `wurk web` asks for with HTTP basic auth; unset serves without "
                 "auth"),
    Setting("web_allowed_hosts", "list[str]", [],
            limit="host names or addresses, `.example.com`, `*.example.com` or `*`",
            help="the `Host` names the dashboard answers besides the loopback names (and "
                 "`wurk web`'s `--bind` address); any other is refused with 400, which stops "
                 "DNS rebinding; `.example.com` is the domain and its subdomains, "
                 "`*.example.com` its subdomains, `*` any host (no protection); mounted with "
                 "`wurk.web.app()`, unset leaves the check to the host application (see "
                 "[Allowed hosts](../how-to/dashboard.md#allowed-hosts))"),
)

HOOKS: tuple[Hook, ...] = (
    Hook("error_handlers", "list[ErrorHandler]", many=True,
         help="each is called with the exception and the job's payload when a job fails"),
    Hook("death_handlers", "list[DeathHandler]", many=True,
         help="each is called with the payload and the last exception when a job goes to "
              "the dead set"),
    Hook("server_middleware", "list[ServerMiddleware]", many=True,
         help="each is called as `mw(payload, queue, call_next)` around every job"),
    Hook("client_middleware", "list[ClientMiddleware]", many=True,
         help="each is called as `mw(job_class, payload, queue, redis, call_next)` before "
              "every push; it may change the payload, or not call `call_next()` to stop "
              "the push"),
    Hook("on_shutdown", "list[ShutdownHook]", many=True,
         help="each is called with no arguments when a worker (`wurk run`, a swarm child, "
              "an embedded worker) has stopped its jobs and flushed its pushes, before it "
              "exits: flush a tracer or an error reporter here, as swarm children leave by "
              "`os._exit` and run no `atexit` handlers"),
    Hook("on_redis_error", "RedisErrorHook | None", many=False,
         help="told of every Redis retry, refusal and give-up of a pool, as "
              "`hook(error, attempt=n, action=...)`"),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# Each numeric setting's inclusive range.
RANGES: dict[str, Range] = {s.name: s.range for s in SETTINGS if s.range is not None}
