"""Workflows: chains, chords and DAGs of steps, run on batches and their
callbacks (``wurk.Workflow``).

The whole feature lives here, each module at the layer of its part
(``scripts/structure.py``):

- ``keys``: key names and the one script that ends a step.
- ``spec``: the definition (steps, ``>>`` composition, the dict form, its
  checks); ``client``: :class:`~wurk.workflows.client.Workflow`, which
  launches one as a root batch; ``status``: what a client reads back
  (``Workflow.status``, the list of workflows); ``results_client``: the
  results passed between steps.

A workflow has no lifecycle step of its own: its steps are batch jobs,
counted out by ``wurk.batches.step``. The dashboard's and the admin
commands' views stay in ``wurk.web`` and ``wurk.admin``.
"""
