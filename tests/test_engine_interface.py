"""Methods use the engine's public interface only: no ``engine.data`` / ``engine.model``,
no private engine attribute, and no rejection counter of their own to bump — every
engine call returns its rejections (``Round.rejected``) and the drivers learn the
rest from ``Engine.tally`` (issue 11, item 4)."""

import ast
from pathlib import Path

import clusterfed
from clusterfed import registry

PACKAGE = Path(clusterfed.__file__).parent
FORBIDDEN_ATTRIBUTES = {"data", "model", "_tallies"}  # on an ``engine``
COUNTERS = {"rejected_updates", "rejected", "rejected_by_device", "uploads"}  # never assigned to


def _offences(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "engine"
            and node.attr in FORBIDDEN_ATTRIBUTES
        ):
            out.append(f"{path.name}:{node.lineno} engine.{node.attr}")
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
        for target in targets:
            while isinstance(target, ast.Subscript):  # x.rejected_by_device[d] += 1
                target = target.value
            if isinstance(target, ast.Attribute) and target.attr in COUNTERS:
                out.append(f"{path.name}:{node.lineno} assigns .{target.attr}")
    return out


def test_no_method_module_reaches_into_the_engine_or_counts_rejections():
    files = sorted((PACKAGE / "algorithms").rglob("*.py")) + sorted((PACKAGE / "continual").rglob("*.py"))
    for kind in registry.KINDS:
        for cls in registry.methods(kind).values():
            module = Path(__import__(cls.__module__, fromlist=["_"]).__file__)
            if module.is_relative_to(PACKAGE):
                assert module in files, f"{cls.__name__} lives outside algorithms/ and continual/"
    assert len(files) >= 20
    assert [o for f in files for o in _offences(f)] == []


def test_the_check_finds_each_kind_of_offence(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "def f(engine, ctx, state):\n"
        "    x = engine.data.train\n"
        "    m = engine.model\n"
        "    engine.rejected_updates += 1\n"
        "    ctx.rejected = 3\n"
        "    state.rejected_by_device[2] += 1\n"
        "    theta[uploads.rejected] = 0.0\n"  # reading Round.rejected is the point
    )
    assert sorted(_offences(bad)) == [
        "bad.py:2 engine.data", "bad.py:3 engine.model", "bad.py:4 assigns .rejected_updates", "bad.py:5 assigns .rejected",
        "bad.py:6 assigns .rejected_by_device",
    ]


def test_local_epochs_is_the_one_name_for_local_training_length():
    """Communication ``rounds`` vs ``local_epochs`` (issue 11, item 6): every engine
    entry point that trains, and a round's plan, call the local length ``local_epochs``."""
    import dataclasses
    import inspect

    from clusterfed.algorithms.protocol import RoundPlan
    from clusterfed.engine import Engine

    for entry in (Engine.train, Engine.local_models, Engine.local_composed):
        names = inspect.signature(entry).parameters
        assert "local_epochs" in names and "epochs" not in names, entry.__name__
    fields = {f.name for f in dataclasses.fields(RoundPlan)}
    assert "local_epochs" in fields and "epochs" not in fields
