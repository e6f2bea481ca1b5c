"""Writing stage outputs: atomically, as JSON or safetensors (never pickle)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from clusterfed.atomic_write import write_atomically
from clusterfed.engine import StackedParams
from clusterfed.tensorfile import save_tensors


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``path`` only if the block succeeds
    (a failed block leaves nothing, not even the parent folders it created)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    created = [p for p in tmp.parents if not p.exists()]  # removed again if the block fails
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for parent in created:  # deepest first; only if still empty
            try:
                parent.rmdir()
            except OSError:
                break
        raise
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)


def write_json(path: Path, obj: object) -> None:
    """Write ``obj`` as JSON through a temporary file (a reader never sees half of it)."""
    text = json.dumps(obj, indent=2, sort_keys=False) + "\n"
    write_atomically(path, lambda tmp: tmp.write_text(text))


def read_json(path: Path) -> object:
    return json.loads(Path(path).read_text())


def save_models(path: Path, params: StackedParams, metadata: dict[str, str]) -> None:
    """Stacked cluster models as safetensors (no pickle, byte-identical for identical
    content), row i = model i."""
    save_tensors(params, path, metadata=metadata)
