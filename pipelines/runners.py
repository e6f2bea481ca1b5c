"""Task runners: Prefect's thread pool by default, or a Dask cluster to scale out."""

from __future__ import annotations

from typing import Literal

from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

RunnerKind = Literal["threads", "dask"]


def task_runner(kind: RunnerKind = "threads", *, workers: int = 2, address: str | None = None) -> TaskRunner:
    """The runner for ``flow.with_options(task_runner=...)``.

    ``dask`` starts a local cluster of ``workers`` single-threaded worker processes
    bound to 127.0.0.1 (no dashboard), or connects to the scheduler at ``address``
    (``tcp://host:8786``) to run beyond one machine.
    """
    if kind == "threads":
        return ThreadPoolTaskRunner(max_workers=workers)
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if address is not None:
            return DaskTaskRunner(address=address)
        return DaskTaskRunner(
            cluster_kwargs={
                "n_workers": workers,
                "threads_per_worker": 1,
                "processes": True,
                "host": "127.0.0.1",
                "dashboard_address": None,
            }
        )
    raise ValueError(f"unknown task runner {kind!r}; expected 'threads' or 'dask'")
