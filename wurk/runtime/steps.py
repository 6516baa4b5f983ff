"""The features that take part in every job's run, in the order their hooks run.

This is the one place that names them: the skeleton
(``wurk.runtime.lifecycle``) and the executors that drive it
(``wurk.runtime.processor``, ``wurk.runtime.aio_processor``) only see
:class:`~wurk.runtime.lifecycle.step.Step` objects. A feature joins by
adding its step here. Order matters where hooks nest: the first step's
``around`` is the outermost, and ``concluding`` runs top down (a job's
result, its batch count and its unique release go in that order, in one
round trip before its ack).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from wurk.batches.step import BatchStep
from wurk.expiry.step import ExpiryStep
from wurk.observe import metrics
from wurk.results.step import ResultsStep
from wurk.runtime.cancelling import CancelStep
from wurk.runtime.observing import ClassMetricsStep, MetricsStep, ProfileStep
from wurk.runtime.overlimit import OverLimitStep
from wurk.runtime.time_limit_step import TimeLimitStep
from wurk.unique.step import UniqueStep

if TYPE_CHECKING:
    from wurk.redis.runtime import Runtime
    from wurk.runtime.inflight import Counters
    from wurk.runtime.job_timer import JobTimer
    from wurk.runtime.lifecycle.step import Step


def job_steps(runtime: Runtime, counters: Counters, timer: JobTimer,
              rng: random.Random, cancels: CancelStep | None = None) -> list[Step]:
    config = runtime.config
    steps: list[Step] = [
        ExpiryStep(config),
        TimeLimitStep(timer),
        # Inside the timer's around: its JobTimeout and a JobCancelled each land once.
        cancels or CancelStep(),
        ResultsStep(),
        BatchStep(config),
        UniqueStep(runtime),
        ProfileStep(runtime),
        OverLimitStep(config, rng),
    ]
    observed = metrics.for_config(config)
    if observed is not None:
        steps.append(MetricsStep(observed))
    if config.class_metrics:
        steps.append(ClassMetricsStep(counters.classes))
    return steps
