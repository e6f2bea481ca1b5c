"""Prefect flows over clusterfed's stage functions (the same ones ``dvc repro`` runs).

- ``pipelines.pipeline_flow``: partition -> coldstart -> (continual) -> evaluate, tracked
  in MLflow with every cluster model registered;
- ``pipelines.sweep_flow``: seeds × scenarios × algorithms, one comparison table and plot;
- ``pipelines.tasks``: the tasks (thin wrappers, cached by inputs, I/O-only retries);
- ``pipelines.runners``: the default thread runner or a Dask cluster.

Flows never call ``dvc``: they write under their own ``root``, so they cannot race a
``dvc repro`` on the DVC-tracked ``data/``.
"""
