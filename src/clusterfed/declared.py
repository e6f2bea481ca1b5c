"""Read methods' declarations from their source, without importing them.

``params.yaml``'s schema needs each method's ``name``, kind and declared
``hyperparameters``, not the method itself, whose module imports torch. Those
declarations are plain data in the class body (``name = "faacl"``,
``hyperparameters = (Param("alpha", 0.1, ...), ...)``), so they are read from the
module's syntax tree, following base classes and ``from … import`` lines, as
setuptools reads a ``version = attr: pkg.__version__`` without importing ``pkg``.
This keeps ``clusterfed validate`` free of torch.

Readable values: literals, tuples and lists of them, ``-x``, ``a + b``, ``a * b`` and
``a / b`` of numbers, names bound at module level (or imported), ``Class.attribute``
and ``Param(...)`` calls. Anything
else (a computed default) raises :class:`NotDeclarative`, and the registry imports the
module instead: the same answer, only slower.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from functools import cache
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from clusterfed.hyperparams import Param

#: Bases from these modules declare none of a method's attributes: they are skipped.
_OPAQUE_MODULES = frozenset({"typing", "typing_extensions", "abc", "collections.abc", "builtins"})
_BUILTIN_NAMES = {"int": int, "float": float, "str": str, "bool": bool, "object": object}
MISSING = object()


class NotDeclarative(Exception):
    """The value is not plain declared data: import the module to read it."""


@dataclass(frozen=True)
class ClassRef:
    """A class found in a module's source (``module`` dotted, ``name`` top level)."""

    module: str
    name: str
    node: ast.ClassDef = field(compare=False, repr=False)

    def attribute(self, attr: str) -> Any:
        """``attr`` as the class would have it: the first class of its MRO that
        assigns it in its body; ``MISSING`` when none does."""
        for cls in _mro(self):
            for stmt in reversed(cls.node.body):
                target = _assigned_name(stmt)
                if target == attr and stmt.value is not None:  # type: ignore[union-attr]
                    return _value(cls.module, stmt.value)  # type: ignore[union-attr]
        return MISSING

    def decorated_by(self, module: str, name: str) -> bool:
        return any(_resolves_to(self.module, d, module, name) for d in self.node.decorator_list)

    def bases(self) -> list[ClassRef]:
        out = []
        for base in self.node.bases:
            if isinstance(base, ast.Subscript):  # ColdStart[State], Generic[State]
                base = base.value
            ref = _symbol(self.module, base)
            if ref is _OPAQUE:
                continue
            if not isinstance(ref, ClassRef):
                raise NotDeclarative(f"{self.module}.{self.name}: base {ast.unparse(base)} is not a class")
            out.append(ref)
        return out


@dataclass(frozen=True)
class _FunctionRef:
    module: str
    name: str


_OPAQUE = object()


def value(module: str, name: str) -> Any:
    """The module-level ``name`` of ``module`` (e.g. a ``Param``), read from source."""
    return _evaluate_ref(module, _resolved(module, name), name)


def class_ref(module: str, name: str) -> ClassRef:
    """The class ``name`` of ``module`` (followed through imports)."""
    found = _resolved(module, name)
    if not isinstance(found, ClassRef):
        raise NotDeclarative(f"{module}:{name} is not a class defined in Python source")
    return found


def classes(module: str) -> list[ClassRef]:
    """Top-level classes of ``module``, in source order."""
    return [ClassRef(module, s.name, s) for s in _tree(module).body if isinstance(s, ast.ClassDef)]


def imported_modules(package: str) -> list[str]:
    """Modules that ``package``'s ``__init__`` imports from (``from x import …``), in order."""
    out: list[str] = []
    for stmt in _tree(package).body:
        if isinstance(stmt, ast.ImportFrom):
            name = _absolute(package, stmt, is_package=True)
            if name not in out:
                out.append(name)
    return out


# -- source ------------------------------------------------------------------------
def source_path(module: str) -> Path:
    """The ``.py`` file of ``module``, found without importing it or its parents."""
    parts = module.split(".")
    spec = importlib.util.find_spec(parts[0])  # a top-level name: imports nothing
    for i in range(1, len(parts)):
        if spec is None or spec.submodule_search_locations is None:
            break
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise NotDeclarative(f"no Python source found for module {module!r}")
    return Path(spec.origin)


@cache
def _tree(module: str) -> ast.Module:
    path = source_path(module)
    return ast.parse(path.read_bytes(), filename=str(path))


def _is_package(module: str) -> bool:
    return source_path(module).name == "__init__.py"


def _absolute(module: str, stmt: ast.ImportFrom, *, is_package: bool | None = None) -> str:
    if not stmt.level:
        return stmt.module or ""
    package = module if (_is_package(module) if is_package is None else is_package) else module.rpartition(".")[0]
    for _ in range(stmt.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{stmt.module}" if stmt.module else package


# -- names -------------------------------------------------------------------------
@dataclass(frozen=True)
class _Bound:
    """A module-level ``name = expr``: the expression and the module it is read in."""

    module: str
    expr: ast.expr


def _assigned_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _lookup(module: str, name: str) -> Any:
    """What ``name`` is bound to at the top level of ``module`` (the last binding)."""
    found: Any = MISSING
    for stmt in _tree(module).body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == name:
            found = ClassRef(module, name, stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            found = _FunctionRef(module, name)
        elif _assigned_name(stmt) == name and getattr(stmt, "value", None) is not None:
            found = _Bound(module, stmt.value)  # type: ignore[attr-defined]
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    found = ("from", _absolute(module, stmt), alias.name)
        elif isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname == name:
                    found = ("module", alias.name)
                elif alias.asname is None and alias.name.split(".")[0] == name:
                    found = ("module", name)
    return found


def _resolved(module: str, name: str) -> Any:
    """Follow imports until ``name`` is a class, a function, a bound value or a module."""
    if module in _OPAQUE_MODULES:
        return _OPAQUE
    found = _lookup(module, name)
    if found is MISSING:
        if name in _BUILTIN_NAMES:
            return _BUILTIN_NAMES[name]
        raise NotDeclarative(f"{module}: name {name!r} is not bound at module level")
    if isinstance(found, tuple) and found[0] == "from":
        source, original = found[1], found[2]
        if source in _OPAQUE_MODULES:
            return _OPAQUE
        try:
            return _resolved(source, original)
        except NotDeclarative:  # ``from package import submodule``
            submodule = f"{source}.{original}"
            source_path(submodule)
            return ("module", submodule)
    if isinstance(found, tuple) and found[0] == "module" and found[1] in _OPAQUE_MODULES:
        return _OPAQUE
    return found


def _symbol(module: str, expr: ast.expr) -> Any:
    """What a name or dotted attribute in ``module`` refers to (not evaluated)."""
    if isinstance(expr, ast.Name):
        return _resolved(module, expr.id)
    if isinstance(expr, ast.Attribute):
        owner = _symbol(module, expr.value)
        if owner is _OPAQUE:
            return _OPAQUE
        if isinstance(owner, tuple) and owner[0] == "module":
            return _resolved(owner[1], expr.attr)
    raise NotDeclarative(f"{module}: {ast.unparse(expr)} is not a name")


def _resolves_to(module: str, expr: ast.expr, target_module: str, target_name: str) -> bool:
    try:
        ref = _symbol(module, expr)
    except NotDeclarative:
        return False
    return isinstance(ref, (_FunctionRef, ClassRef)) and (ref.module, ref.name) == (target_module, target_name)


def _mro(cls: ClassRef) -> list[ClassRef]:
    """C3 linearisation, as Python computes ``__mro__``."""
    bases = cls.bases()
    seqs = [_mro(b) for b in bases] + [bases]
    out = [cls]
    while any(seqs):
        seqs = [s for s in seqs if s]
        head = next((s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), None)
        if head is None:
            raise NotDeclarative(f"{cls.module}.{cls.name}: inconsistent base classes")
        out.append(head)
        seqs = [[c for c in s if c != head] for s in seqs]
    return out


# -- values ------------------------------------------------------------------------
def _value(module: str, expr: ast.expr) -> Any:
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, (ast.Tuple, ast.List)):
        items = [_value(module, e) for e in expr.elts]
        return tuple(items) if isinstance(expr, ast.Tuple) else items
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, (ast.USub, ast.UAdd)):
        operand = _value(module, expr.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(expr.op, ast.USub) else operand
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        return _value(module, expr.left) + _value(module, expr.right)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Mult, ast.Div)):
        left, right = _value(module, expr.left), _value(module, expr.right)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            return left * right if isinstance(expr.op, ast.Mult) else left / right
    if isinstance(expr, ast.Name) and expr.id in _BUILTIN_NAMES and _lookup(module, expr.id) is MISSING:
        return _BUILTIN_NAMES[expr.id]
    if isinstance(expr, ast.Name):
        return _evaluate_ref(module, _resolved(module, expr.id), ast.unparse(expr))
    if isinstance(expr, ast.Attribute):
        owner = _symbol(module, expr.value) if isinstance(expr.value, (ast.Name, ast.Attribute)) else None
        if isinstance(owner, ClassRef):
            found = owner.attribute(expr.attr)
            if found is not MISSING:
                return found
        elif isinstance(owner, tuple) and owner[0] == "module":
            return _evaluate_ref(owner[1], _resolved(owner[1], expr.attr), ast.unparse(expr))
    if isinstance(expr, ast.Call) and _resolves_to(module, expr.func, Param.__module__, Param.__name__):
        if any(isinstance(a, ast.Starred) for a in expr.args) or any(k.arg is None for k in expr.keywords):
            raise NotDeclarative(f"{module}: {ast.unparse(expr)}: *args / **kwargs")
        return Param(*(_value(module, a) for a in expr.args), **{k.arg: _value(module, k.value) for k in expr.keywords})
    raise NotDeclarative(f"{module}: {ast.unparse(expr)} is not declared data")


def _evaluate_ref(module: str, ref: Any, text: str) -> Any:
    if isinstance(ref, _Bound):
        return _value(ref.module, ref.expr)
    if isinstance(ref, type):  # int, float, str, bool
        return ref
    raise NotDeclarative(f"{module}: {text} is not declared data")

