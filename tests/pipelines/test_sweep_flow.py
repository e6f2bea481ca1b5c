"""The sweep: one table over seeds x scenarios x algorithms, equal on threads and on Dask."""

import csv

import pytest

from pipelines.runners import task_runner
from pipelines.sweep_flow import clusterfed_sweep


@pytest.fixture(scope="module")
def sweep(prefect_server, project, dvc_reference):
    root = project / "runs" / "sweep"
    rows = clusterfed_sweep(params_path=str(project / "params.yaml"), root=str(root))
    return root, rows


def test_table_cells_are_the_evaluate_stages_numbers(sweep, dvc_reference):
    root, rows = sweep
    assert [(r["scenario"], r["algorithm"]) for r in rows] == [("S2", "faacl"), ("S2", "fedavg")]
    for row in rows:
        assert {k: v for k, v in row.items() if k not in ("scenario", "algorithm")} == dvc_reference["coldstart"][row["algorithm"]]
    with open(root / "comparison.csv") as f:
        assert [r["algorithm"] for r in csv.DictReader(f)] == ["faacl", "fedavg"]
    assert "| S2 | faacl |" in (root / "comparison.md").read_text()
    assert (root / "comparison.png").stat().st_size > 0


def test_dask_runner_gives_the_same_table(sweep, project):
    _, rows = sweep
    on_dask = clusterfed_sweep.with_options(task_runner=task_runner("dask", workers=2))
    assert on_dask(params_path=str(project / "params.yaml"), root=str(project / "runs" / "sweep-dask")) == rows
