"""wurk: background jobs for Python on Sidekiq's Redis wire protocol.

Define jobs with ``@wurk.job`` or ``wurk.Job``, enqueue them with
``perform_async``, run them with ``wurk run`` or ``wurk-swarm``.
"""

from wurk.buffered import PushBufferFullError
from wurk.client import Client
from wurk.config import Config, ConfigError, configure, default_config
from wurk.confirmed import PushNotConfirmedError
from wurk.job import Job, JobFunction, UnknownJobError, job, registry
from wurk.payload import ArgumentError
from wurk.version import __version__

__all__ = [
    "ArgumentError",
    "Client",
    "Config",
    "ConfigError",
    "Job",
    "JobFunction",
    "PushBufferFullError",
    "PushNotConfirmedError",
    "UnknownJobError",
    "__version__",
    "configure",
    "default_config",
    "job",
    "registry",
]
