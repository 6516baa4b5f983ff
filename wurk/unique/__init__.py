"""Unique jobs (Sidekiq Enterprise's ``unique_for``): while a job's lock is
held, a push of the same class, arguments and queue is refused.

The whole feature lives here, each module at the layer of its part
(``scripts/structure.py``):

- ``keys``: the lock key (a digest of class, queue and arguments), its
  digest input, and what a payload's ``unique_until`` says.
- ``push``: :class:`~wurk.unique.push.UniqueLock`, the push pipeline's
  step that takes the locks, and the checks of the job options.
- ``step``: the job lifecycle's step that releases a lock when the job
  ends (``unique_until``: start or success), registered in
  ``wurk.runtime.steps``.
- ``api``: :class:`~wurk.unique.api.UniqueLocks` for the admin API
  (``wurk.api``).

Who holds each lock, for the dashboard, is ``wurk.api.unique_holders``: it
reads the general API's job records and workers, and a feature's API builds
only on what lies below ``wurk.api``.

Releases Redis refused are kept and sent again until they land by
``wurk.wire.kept_writes``, the feature-free keeper of refused writes.
"""
