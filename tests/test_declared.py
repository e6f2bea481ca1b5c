"""Declarations read from source (clusterfed.declared) are what importing gives."""

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from clusterfed import declared, registry
from clusterfed.hyperparams import Param

PLUGIN_SRC = Path(__file__).parent / "plugin" / "src"


def test_every_builtin_declaration_equals_its_imported_class():
    for kind in registry.KINDS:
        found, classes = registry.declarations(kind), registry.methods(kind)
        assert list(found) == list(classes)  # same names, same (registration) order
        for name, cls in classes.items():
            d = found[name]
            assert d.load() is cls
            assert (d.kind, d.hyperparameters) == (cls.kind, cls.hyperparameters)
            assert d.full_participation == getattr(cls, "full_participation", False)


def test_declarations_are_read_without_importing_any_method():
    probe = (
        "import sys; from clusterfed import registry\n"
        "print(len(registry.declarations('coldstart')), len(registry.declarations('continual')))\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('clusterfed.algorithms')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == f"{len(registry.methods('coldstart'))} {len(registry.methods('continual'))}"
    assert out[1] == "[]"


def test_a_plugin_class_is_read_through_its_imports(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN_SRC))
    ref = declared.class_ref("clusterfed_toy", "RandomGroups")  # ColdStart via clusterfed.algorithms' __init__
    assert ref.attribute("kind") == "coldstart"
    assert ref.attribute("hyperparameters") == (Param("k", 2, "number of random groups", symbol="k", kind=int, gt=0),)
    assert ref.attribute("full_participation") is False  # inherited from ColdStart


def _write(tmp_path: Path, monkeypatch, name: str, source: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


def test_values_follow_names_bases_and_arithmetic(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, "decl_values_toy", """
        from clusterfed.hyperparams import Param as P
        from clusterfed.algorithms.protocol import ColdStart

        LOW = -0.5
        K = P("k", 3, "clusters " "(k)", kind=int, gt=0)

        class Base(ColdStart):
            hyperparameters = (K,)

        class Child(Base):
            name = "child"
            hyperparameters = Base.hyperparameters + (P("b", LOW, "offset", ge=-1.0, choices=None),)
        """)
    child = declared.class_ref("decl_values_toy", "Child")
    assert child.attribute("hyperparameters") == (
        Param("k", 3, "clusters (k)", kind=int, gt=0), Param("b", -0.5, "offset", ge=-1.0),
    )
    assert (child.attribute("kind"), child.attribute("name")) == ("coldstart", "child")
    assert child.attribute("nothing") is declared.MISSING


def test_a_computed_value_is_not_declarative_and_the_registry_imports_it(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, "decl_computed_toy", """
        from clusterfed.hyperparams import Param
        from clusterfed.algorithms.protocol import ColdStart
        from clusterfed.registry import register

        @register
        class Computed(ColdStart):
            name = "decl_computed_toy"
            hyperparameters = (Param("k", max(2, 3), "clusters", kind=int),)
        """)
    with pytest.raises(declared.NotDeclarative, match=r"max\(2, 3\) is not declared data"):
        declared.class_ref("decl_computed_toy", "Computed").attribute("hyperparameters")
    try:
        (d,) = registry._declared_in("decl_computed_toy", None)  # falls back to importing the module
        assert (d.name, d.hyperparameters) == ("decl_computed_toy", (Param("k", 3, "clusters", kind=int),))
    finally:
        registry._REGISTRY["coldstart"].pop("decl_computed_toy", None)
