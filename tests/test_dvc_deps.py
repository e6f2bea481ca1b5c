"""dvc.yaml: every stage depends on all the code it imports, so an edit reruns it."""

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_every_stage_depends_on_every_module_it_imports():
    probe = (
        "import sys, clusterfed.cli, clusterfed.stages; from clusterfed import registry; "
        "registry.methods('coldstart'); "
        "print('\\n'.join(m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', None)))"
    )
    files = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    src = REPO / "src"
    imported = {Path(f).resolve().relative_to(REPO).as_posix() for f in files if Path(f).resolve().is_relative_to(src)}
    assert "src/clusterfed/stages/coldstart.py" in imported
    for name, stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].items():
        deps = [d if isinstance(d, str) else next(iter(d)) for d in stage["deps"]]
        assert f"stages/{name}.py" in deps
        missing = sorted(f for f in imported if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in deps))
        assert missing == [], f"stage {name} does not depend on {missing}"
