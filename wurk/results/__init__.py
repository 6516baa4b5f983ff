"""Job results: a job's return value (or its final failure) kept in Redis for
whoever pushed it, with ``wurk.result(jid)`` and ``await wurk.aresult(jid)``.

The whole feature lives here, each module at the layer of its part
(``scripts/structure.py``):

- ``records``: the record format (``wurk:result:<jid>`` and its ready list),
  the script that stores one, and :class:`~wurk.results.records.Outcome`,
  a record read back.
- ``client``: ``result``, ``aresult``, ``peek``, ``wait``: reading and
  waiting for a record, sync and async, on the runtime's wait pool.
- ``step``: the job lifecycle's step that stores a job's result as it ends,
  registered in ``wurk.runtime.steps``.
"""
