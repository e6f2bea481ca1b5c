"""The README's "Add a method" section is the whole change, and it works: its module,
its test and its registration line are taken from the README and run (in a fresh
interpreter, so the toy method never enters this session's registry)."""

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
    section = _section()
    module = _block(section, "# src/clusterfed/algorithms/random_groups.py")
    test = _block(section, "# tests/algorithms/test_random_groups.py")
    registration = _block(section, "from clusterfed.algorithms.random_groups import RandomGroups")
    assert registration.strip() == "from clusterfed.algorithms.random_groups import RandomGroups"
    (tmp_path / "random_groups.py").write_text(module)
    (tmp_path / "test_random_groups.py").write_text(test)
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    script = f"""
import importlib.util, sys
import pytest
import clusterfed.algorithms as algorithms
spec = importlib.util.spec_from_file_location("clusterfed.algorithms.random_groups", {str(tmp_path / "random_groups.py")!r})
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
exec({registration!r}, vars(algorithms))  # the one registration line, in algorithms/__init__.py's namespace
from clusterfed import registry
assert registry.get("coldstart", "random_groups") is algorithms.RandomGroups
sys.exit(pytest.main([{str(tmp_path)!r}, "-q", "-p", "no:cacheprovider", "--rootdir", {str(tmp_path)!r}]))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout
