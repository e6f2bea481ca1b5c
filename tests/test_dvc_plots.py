"""``dvc plots show`` draws exactly the plots declared at the top of dvc.yaml, with
continual on or off: no stage-level entries without x/y, no stray files read."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from clusterfed import stages
from clusterfed.layout import RunLayout
from clusterfed.config import parse_params
from tests.test_reproducible_outputs import PARAMS

REPO = Path(__file__).resolve().parents[1]
DVC = [sys.executable, "-m", "dvc"]


def _declared() -> list[str]:
    return [next(iter(p)) if isinstance(p, dict) else p for p in yaml.safe_load((REPO / "dvc.yaml").read_text())["plots"]]


def _shown(project: Path) -> tuple[list[str], object]:
    out = subprocess.run([*DVC, "plots", "show", "--json"], cwd=project, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    shown = json.loads(out.stdout)
    return list(shown["data"]), shown.get("errors")


def test_plots_show_renders_exactly_the_declared_plots_with_continual_on_and_off(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "dvc.yaml", project)
    subprocess.run([*DVC, "init", "--no-scm"], cwd=project, capture_output=True, check=True)
    shutil.copytree(REPO / ".dvc" / "plots", project / ".dvc" / "plots")  # the by_algorithm template
    for enabled in (True, False):
        params = parse_params({**PARAMS, "continual": {**PARAMS["continual"], "enabled": enabled}})
        layout = RunLayout(project)
        if enabled:
            stages.partition(params, layout)
            stages.coldstart(params, layout, progress=False)
            stages.continual(params, layout, progress=False)
        stages.evaluate(params, layout)
        shown, errors = _shown(project)
        # this project runs no `unsupervised` stage (FedCRef): its declared images are absent
        errors = [e for e in errors or [] if not e["source"].startswith("plots/unsupervised/")]
        assert shown == _declared() and errors == [], (enabled, shown, errors)
    assert sorted(p.name for p in (project / "plots" / "continual").iterdir()) == ["accuracy.csv"]
