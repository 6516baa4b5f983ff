"""The worker side of expiry: a job fetched past its ``expiry`` ends unrun.

Its ``admit`` hook turns the job away before anything of it runs. The
skeleton then settles it as "dropped": its other steps learn it will never
run (a result waiter, its batch), it is acknowledged (no retry, no dead
entry) and counted as processed, as Sidekiq Pro counts it. This step logs
``job.expired`` with how late the job was and counts it in
``wurk.jobs.expired`` when metrics are on. A garbage ``expiry`` from Redis
counts as none (``wurk.runtime.time_limits`` logs it).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from wurk.core.job_errors import JobExpiredError
from wurk.core.logging import get_logger
from wurk.observe import metrics
from wurk.runtime.lifecycle.step import Run, Step
from wurk.runtime.time_limits import limits_of

if TYPE_CHECKING:
    from wurk.settings.config import Config

log = get_logger("wurk.time_limits")


class ExpiryStep(Step):
    name = "expiry"
    triggers = ("expiry",)

    def __init__(self, config: Config) -> None:
        self.config = config

    def admit(self, run: Run) -> BaseException | None:
        expiry = limits_of(run.job, run.options, run.notes).expiry
        if expiry is None:
            return None
        late = time.time() - expiry
        if late <= 0:
            return None
        cls = metrics.job_class(run.job)
        log.info("job.expired", jid=run.jid, **{"class": cls}, queue=run.queue,
                 late=round(late, 3))
        observed = metrics.for_config(self.config)
        if observed is not None:
            try:
                observed.expired(cls, run.queue)
            except Exception as exc:  # noqa: BLE001 - a metrics bug must not keep the job
                log.warning("metrics.job_failed", error=f"{type(exc).__name__}: {exc}")
        return JobExpiredError("dropped unrun: fetched after its expiry")
