"""wurk: background jobs for Python on Sidekiq's Redis wire protocol.

Define jobs with ``@wurk.job`` or ``wurk.Job``, enqueue them with
``perform_async``, run them with ``wurk run`` or ``wurk-swarm``.
"""

from wurk import old_paths
from wurk.push.buffered import PushBufferFullError
from wurk.push.client import Client
from wurk.push.confirmed import PushNotConfirmedError
from wurk.push.job import Job, JobFunction, UnknownJobError, job, registry
from wurk.push.time_options import JobTimeout
from wurk.runtime import forking  # noqa: F401 - registers the after-fork resets
from wurk.settings.config import Config, ConfigError, configure, default_config
from wurk.version import __version__
from wurk.wire.payload import ArgumentError

# import wurk.config and the other pre-layering paths still work, with a warning.
old_paths.install()

__all__ = [
    "ArgumentError",
    "Client",
    "Config",
    "ConfigError",
    "Job",
    "JobFunction",
    "JobTimeout",
    "PushBufferFullError",
    "PushNotConfirmedError",
    "UnknownJobError",
    "__version__",
    "configure",
    "default_config",
    "job",
    "registry",
]
