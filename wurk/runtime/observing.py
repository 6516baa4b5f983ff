"""What a run shows of itself, as steps of the job's lifecycle: profiles and figures.

1. :class:`ProfileStep`: a payload that asks for a profile (Sidekiq 8's
   ``profile`` field) runs under cProfile on a thread, the profile stored
   after (``wurk.observe.profiler``).
2. :class:`MetricsStep`: every run timed and counted while metrics are on
   (``wurk.observe.metrics``).
3. :class:`ClassMetricsStep`: every run's duration and failure per class
   (``class_metrics``, ``wurk.observe.class_metrics``).
With all off, none is registered and a run pays nothing for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from wurk.core.logging import get_logger
from wurk.observe import metrics, profiler
from wurk.runtime.lifecycle.step import Call, Run, Step

if TYPE_CHECKING:
    from wurk.observe.class_metrics import ClassMetrics
    from wurk.redis.runtime import Runtime

metrics_log = get_logger("wurk.metrics")
class_log = get_logger("wurk.class_metrics")


class ProfileStep(Step):
    name = "profile"
    triggers = ("profile",)
    needs_thread = True

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def around(self, run: Run, call: Call) -> Call:
        return lambda: profiler.profiled(self.runtime, run.job, call)


class MetricsStep(Step):
    name = "metrics"
    every_job = True

    def __init__(self, observed: metrics.Metrics) -> None:
        self.observed = observed

    def observe(self, run: Run, elapsed: float, failed: bool) -> None:
        try:
            self.observed.job(metrics.job_class(run.job), run.queue, elapsed * 1000.0, failed)
        except BaseException as exc:  # noqa: BLE001 - a metrics bug must not touch the job
            metrics_log.warning("metrics.job_failed", error=f"{type(exc).__name__}: {exc}")


class ClassMetricsStep(Step):
    name = "class_metrics"
    every_job = True

    def __init__(self, recorder: ClassMetrics) -> None:
        self.recorder = recorder

    def observe(self, run: Run, elapsed: float, failed: bool) -> None:
        try:
            self.recorder.record(metrics.job_class(run.job), elapsed * 1000.0, failed=failed)
        except BaseException as exc:  # noqa: BLE001 - a metrics bug must not touch the job
            class_log.warning("class_metrics.record_failed", error=f"{type(exc).__name__}: {exc}")
