"""Batches (Sidekiq Pro's): jobs grouped under one bid, with callbacks when
they complete, succeed or one dies.

The whole feature lives here, each module at the layer of its part
(``scripts/structure.py``):

- ``keys``: key names, limits and the read side of a batch record;
  ``lua``, ``push_lua``, ``failure_lua``: its atomic steps as Lua scripts.
- ``push``: the push pipeline's batch count (and the plain writer's counted
  write); ``client``: :class:`~wurk.batches.client.Batch`, the public face
  (``wurk.Batch``).
- ``step``: the job lifecycle's step that records each job's end in its
  batch, registered in ``wurk.runtime.steps``.
- ``api``: :class:`~wurk.batches.api.BatchSet` and ``BatchStatus`` for the
  admin API (``wurk.api``); the dashboard's and the admin commands' views
  stay in ``wurk.web`` and ``wurk.admin``.

Workflows build on batches (``wurk.workflows.client``).
"""
