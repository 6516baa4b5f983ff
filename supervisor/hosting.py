"""Hosting mode: a swarm inside a process that owns the signals (a web server).

The host keeps its signal handlers; the swarm installs none. Supervision runs
on a background thread (which also forks, so children's parent-death signal
stays armed while the host lives). At the host's exit the drain is requested
and the supervise thread is given shutdown_timeout + grace + 1 s to finish it;
the host drains directly only when the supervisor never started or died.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.swarm import Swarm
from supervisor.topology import Topology, load


class HostedSwarm:
    def __init__(self, topology: Topology | str | Path) -> None:
        self.topology = topology if isinstance(topology, Topology) else load(topology)
        self.swarm = Swarm(self.topology, hosted=True)

    def start(self) -> HostedSwarm:
        # Before the first fork, so a boot that fails halfway still drains.
        self.swarm.register_drain_hooks()
        # A daemon thread: the interpreter joins non-daemon threads before
        # it runs atexit hooks, and our atexit hook is what ends this one.
        self.swarm.start_supervising(daemon=True)
        return self

    def stop(self) -> int:
        """Drain now (the host's shutdown hook may call this instead of waiting for exit)."""
        thread = self.swarm.supervisor_thread
        if thread is not None and thread.is_alive():
            self.swarm.request_shutdown()
            thread.join(self.topology.shutdown_timeout + self.topology.shutdown_grace + 1)
            if not thread.is_alive():
                return self.swarm.exit_code
        return self.swarm.shutdown()
