"""wurk: background jobs for Python on Sidekiq's Redis wire protocol.

Define jobs with ``@wurk.job`` or ``wurk.Job``, enqueue them with
``perform_async`` (``await job.aperform_async`` from async code), run them
with ``wurk run`` or ``wurk-swarm``.
``wurk.result(jid)`` (``await wurk.aresult(jid)``) waits for the result of a
job pushed with ``store_result=True``. ``wurk.leader()`` elects one process of
a cluster for work only one may do.
"""

from typing import TYPE_CHECKING, Any

from wurk import limiter
from wurk.batches.client import Batch, BatchError
from wurk.core.cancelling import cancelled
from wurk.core.job_errors import JobCancelled, JobTimeout
from wurk.limiter import OverLimit
from wurk.push.aclient import AsyncClient
from wurk.push.buffered import PushBufferFullError
from wurk.push.client import Client
from wurk.push.confirmed import PushNotConfirmedError
from wurk.push.job import Job, JobFunction, UnknownJobError, job, registry
from wurk.push.landing import PushOutcomeUnknown
from wurk.push.nowhere import PushSpooledWarning
from wurk.push.periodic import PeriodicError, periodic
from wurk.results.client import JobFailed, ResultTimeout, aresult, result
from wurk.runtime import forking  # noqa: F401 - registers the after-fork resets
from wurk.settings.config import Config, ConfigError, configure, default_config
from wurk.unique.push import UniqueKeyError
from wurk.version import __version__
from wurk.wire.payload import ArgumentError
from wurk.workflows.client import Workflow, WorkflowError
from wurk.workflows.spec import group, step

if TYPE_CHECKING:
    from wurk.runtime.leader import Leader, leader

__all__ = [
    "ArgumentError",
    "AsyncClient",
    "Batch",
    "BatchError",
    "Client",
    "Config",
    "ConfigError",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobFunction",
    "JobTimeout",
    "Leader",
    "OverLimit",
    "PeriodicError",
    "PushBufferFullError",
    "PushNotConfirmedError",
    "PushOutcomeUnknown",
    "PushSpooledWarning",
    "ResultTimeout",
    "UniqueKeyError",
    "UnknownJobError",
    "Workflow",
    "WorkflowError",
    "__version__",
    "aresult",
    "cancelled",
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
