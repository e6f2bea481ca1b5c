"""The README's "Add a method" section is the whole change, and it works: its module,
its test and its registration line are taken from the README and applied to a copy
of the package (so the toy method never enters this checkout's registry)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _section() -> str:
    text = (REPO / "README.md").read_text()
    return text[text.index("## Add a method"):text.index("\n## ", text.index("## Add a method") + 1)]


def _block(section: str, first_line: str) -> str:
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"README: no python block starting with {first_line!r}")


def test_the_readme_toy_method_registers_validates_and_passes_its_test(tmp_path):
    """Apply the README's change to a copy of the package (module file, one line in
    ``algorithms/__init__.py``) and run the README's test against that copy."""
    section = _section()
    module = _block(section, "# src/clusterfed/algorithms/random_groups.py")
    test = _block(section, "# tests/algorithms/test_random_groups.py")
    registration = _block(section, "from clusterfed.algorithms.random_groups import RandomGroups")
    assert registration.strip() == "from clusterfed.algorithms.random_groups import RandomGroups"
    package = tmp_path / "src" / "clusterfed"
    shutil.copytree(REPO / "src" / "clusterfed", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "algorithms" / "random_groups.py").write_text(module)
    init = package / "algorithms" / "__init__.py"
    init.write_text(init.read_text() + registration)
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_random_groups.py").write_text(test)
    shutil.copy(REPO / "tests" / "conftest.py", tests / "conftest.py")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
    doc = subprocess.run(
        [sys.executable, "-c", "import clusterfed, sys; from clusterfed.config import params_table; "
         "print(clusterfed.__file__); print(params_table())"],
        capture_output=True, text=True, cwd=tmp_path, env=env, check=True,
    ).stdout
    assert doc.startswith(str(package))  # the copy, not this checkout
    assert "| `coldstart.random_groups.k` | k | int in (0, ∞) | `2` | number of random groups |" in doc
