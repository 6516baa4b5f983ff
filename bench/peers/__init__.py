"""Job and enqueue modules for the harness: one per system (see bench/harness.py).

Each ``<system>_jobs`` module defines the benchmark job (``shape``, ``ts``),
``enqueue_bulk(n, shape)`` and ``enqueue_paced(rate, seconds, shape)``;
``bench.peers.run`` calls them in a subprocess so the peer's own library is
imported in the peer's own virtualenv. They import nothing from wurk except
``wurk_jobs``.
"""
