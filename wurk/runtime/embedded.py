"""Embedded mode: a threads-only worker inside another process (a web server).

No fork and no signal handlers: the host owns both. ``start`` registers the
drain at exit *before* it brings anything up, so a start that fails halfway
still stops what it started; ``stop`` drains within shutdown_timeout.
Suited to small apps; use ``wurk-swarm`` when jobs need their own processes.
A job past its ``hard_timeout`` is settled as failed, but the worker is not
recycled (nothing would restart it): its thread is lost until the job returns.
As every entry point, ``start`` refuses (``NoJobsError``) while no job of the
application is registered: such a worker would fail every job it fetched.
"""

from __future__ import annotations

import atexit
import os
import threading
import time

from wurk.core.logging import get_logger
from wurk.runtime.launcher import Launcher, run_shutdown_hooks
from wurk.runtime.loading import require_jobs
from wurk.settings.config import Config, default_config

log = get_logger("wurk.embedded")
EMBEDDED_HINT = ("no job class is registered: import the modules that define jobs "
                 "before the embedded worker starts")


class Embedded:
    def __init__(self, config: Config | None = None) -> None:
        self.config = config or default_config()
        self.launcher: Launcher | None = None
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()

    def start(self) -> Embedded:
        atexit.register(self.stop)
        with self._lock:
            if self.launcher is None:
                # The rule of every entry point: no job of the application's, no worker.
                require_jobs(hint=EMBEDDED_HINT)
                # Nothing would start a new worker here: a job past its hard
                # limit is settled as failed, and the worker carries on.
                self.launcher = Launcher(self.config, extra_info={"embedded": True},
                                         recycle=False)
                self.launcher.start()
        log.info("embedded.started", identity=self.launcher.identity)
        return self

    def stop(self) -> None:
        """Drain; idempotent, and a no-op in a process forked from the host."""
        if os.getpid() != self._owner_pid:
            return
        with self._lock:
            launcher, self.launcher = self.launcher, None
        if launcher is not None and not launcher.stopped.is_set():
            launcher.stop(time.monotonic() + self.config.shutdown_timeout)
            run_shutdown_hooks(self.config)
