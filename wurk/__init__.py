"""wurk: background jobs for Python on Sidekiq's Redis wire protocol.

Define jobs with ``@wurk.job`` or ``wurk.Job``, enqueue them with
``perform_async`` (``await job.aperform_async`` from async code), run them
with ``wurk run`` or ``wurk-swarm``.
``wurk.result(jid)`` waits for the result of a job pushed with
``store_result=True``. ``wurk.leader()`` elects one process of a cluster for work only one may do.
"""

from typing import TYPE_CHECKING, Any

from wurk import limiter, old_paths
from wurk.limiter import OverLimit
from wurk.push.aclient import AsyncClient
from wurk.push.batch import Batch, BatchError
from wurk.push.buffered import PushBufferFullError
from wurk.push.client import Client
from wurk.push.confirmed import PushNotConfirmedError
from wurk.push.job import Job, JobFunction, UnknownJobError, job, registry
from wurk.push.periodic import PeriodicError, periodic
from wurk.push.results import JobFailed, ResultTimeout, result
from wurk.push.time_options import JobTimeout
from wurk.push.unique import UniqueKeyError
from wurk.push.workflow import Workflow, WorkflowError
from wurk.push.workflow_spec import group, step
from wurk.runtime import forking  # noqa: F401 - registers the after-fork resets
from wurk.settings.config import Config, ConfigError, configure, default_config
from wurk.version import __version__
from wurk.wire.payload import ArgumentError

if TYPE_CHECKING:
    from wurk.runtime.leader import Leader, leader

# import wurk.config and the other pre-layering paths still work, with a warning.
old_paths.install()

__all__ = [
    "ArgumentError",
    "AsyncClient",
    "Batch",
    "BatchError",
    "Client",
    "Config",
    "ConfigError",
    "Job",
    "JobFailed",
    "JobFunction",
    "JobTimeout",
    "Leader",
    "OverLimit",
    "PeriodicError",
    "PushBufferFullError",
    "PushNotConfirmedError",
    "ResultTimeout",
    "UniqueKeyError",
    "UnknownJobError",
    "Workflow",
    "WorkflowError",
    "__version__",
    "configure",
    "default_config",
    "group",
    "job",
    "leader",
    "limiter",
    "periodic",
    "registry",
    "result",
    "step",
]


def __getattr__(name: str) -> Any:
    # Leader election is runtime code: loaded on first use, so a process that
    # only pushes jobs never imports it.
    if name in ("Leader", "leader"):
        from wurk.runtime import leader as module  # noqa: PLC0415

        return getattr(module, name)
    raise AttributeError(f"module 'wurk' has no attribute {name!r}")
