"""The worker runtime: launcher, manager, processors, fetchers, scheduler, retries, heartbeat."""
