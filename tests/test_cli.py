"""The command line starts without the heavy libraries (measured in benchmarks/cli_start_time.py):
neither ``--help`` nor ``validate`` imports them; the params schema reads the methods'
declared hyperparameters from their source (clusterfed.declared), not from torch-laden
modules."""

import subprocess
import sys

HEAVY = ("torch", "sklearn", "scipy", "pandas", "mlflow", "prefect", "dvc", "matplotlib")


def _imported_after(argv: list[str], cwd) -> list[str]:
    probe = (
        "import sys; from clusterfed.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_help_and_validate_import_no_heavy_library(tmp_path):
    (tmp_path / "params.yaml").write_text("seeds: [1]\n")
    assert _imported_after(["--help"], tmp_path)[-1] == "[]"
    lines = _imported_after(["validate"], tmp_path)
    assert lines == ["params.yaml: ok", "[]"]
