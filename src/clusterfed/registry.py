"""The method registry: every cold-start and continual method, by name.

In-tree methods register with the ``@register`` decorator on their class. Packages
outside clusterfed register through the entry-point group ``clusterfed.algorithms``
(``pyproject.toml``: ``[project.entry-points."clusterfed.algorithms"]``,
``mymethod = "mypkg.mymethod:MyMethod"``); the entry point names a method class, or
a module whose classes use ``@register``. The registry is what ``params.yaml``'s
schema, the stages, the Prefect flows and the MLflow registry read, so a registered
method runs through all of them with no edit of clusterfed.

:func:`declarations` answers what ``params.yaml`` needs (names, kinds, declared
hyperparameters) from the methods' source, without importing them
(:mod:`clusterfed.declared`): ``clusterfed validate`` does not load torch.
:func:`methods` and :func:`get` import the classes, for the stages.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Literal, TypeVar

from clusterfed import declared
from clusterfed.hyperparams import Param

Kind = Literal["coldstart", "continual"]
KINDS: tuple[Kind, ...] = ("coldstart", "continual")
ENTRY_POINT_GROUP = "clusterfed.algorithms"
#: The packages whose ``__init__`` imports the built-in methods (one line per module).
BUILTIN_PACKAGES = ("clusterfed.algorithms", "clusterfed.continual")
#: Keys of the params sections that a method name would shadow.
RESERVED = frozenset({"algorithms", "rounds", "enabled", "setting", "timesteps", "block", "schedule",
                      "samples_per_device", "test_samples_per_device"})

T = TypeVar("T", bound=type)
_REGISTRY: dict[str, dict[str, type]] = {k: {} for k in KINDS}
_loaded = False


def register(cls: T) -> T:
    """Class decorator: add a method (``cls.kind`` says which kind) under ``cls.name``."""
    kind, name = getattr(cls, "kind", None), getattr(cls, "name", None)
    _check_name(cls.__qualname__, kind, name)
    known = _REGISTRY[kind].get(name)
    if known is not None and known is not cls:
        raise ValueError(f"{kind} method {name!r} is registered twice: {known.__module__} and {cls.__module__}")
    _REGISTRY[kind][name] = cls
    return cls


def _check_name(owner: str, kind: object, name: object) -> None:
    if kind not in KINDS:
        raise TypeError(f"{owner}: a method derives from ColdStart or ContinualMethod")
    if not isinstance(name, str) or not name.isidentifier() or name in RESERVED:
        raise ValueError(f"{owner}: name {name!r} must be an identifier other than {sorted(RESERVED)}")


def methods(kind: Kind, *, builtin_only: bool = False) -> dict[str, type]:
    """Every registered method of ``kind`` by name, in registration order."""
    _load()
    found = _REGISTRY[kind]
    if builtin_only:
        return {n: c for n, c in found.items() if c.__module__.startswith("clusterfed.")}
    return dict(found)


def get(kind: Kind, name: str) -> type:
    found = methods(kind)
    if name not in found:
        raise KeyError(f"unknown {kind} method {name!r}; registered: {sorted(found)}")
    return found[name]


def _load() -> None:
    """Import the built-in methods, then every entry point of the group, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import clusterfed.algorithms  # noqa: F401  (their classes use @register)
    import clusterfed.continual  # noqa: F401

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as exc:  # a broken plugin is named, not hidden
            raise ImportError(f"entry point {ep.name!r} = {ep.value!r} of {ENTRY_POINT_GROUP!r}: {exc}") from exc
        if isinstance(obj, type):
            register(obj)


def reload() -> None:
    """Look at the entry points again (after installing a plugin in this process)."""
    global _loaded, _DECLARATIONS
    _loaded = False
    _DECLARATIONS = None
    _load()


@dataclass(frozen=True)
class Declaration:
    """What ``params.yaml`` needs of a method, read from its source (not imported)."""

    kind: Kind
    name: str
    module: str
    qualname: str
    hyperparameters: tuple[Param, ...]
    full_participation: bool = False

    @property
    def builtin(self) -> bool:
        return self.module.startswith("clusterfed.")

    def load(self) -> type:
        """The method class itself (imports its module)."""
        return getattr(importlib.import_module(self.module), self.qualname)


_DECLARATIONS: dict[str, dict[str, Declaration]] | None = None


def declarations(kind: Kind, *, builtin_only: bool = False) -> dict[str, Declaration]:
    """Every method of ``kind`` by name, in registration order, as :func:`methods`
    lists them, but read from the source: the built-in modules that
    ``BUILTIN_PACKAGES`` import, then the entry points."""
    global _DECLARATIONS
    if _DECLARATIONS is None:
        _DECLARATIONS = _read_declarations()
    found = _DECLARATIONS[kind]
    return {n: d for n, d in found.items() if d.builtin} if builtin_only else dict(found)


def _read_declarations() -> dict[str, dict[str, Declaration]]:
    out: dict[str, dict[str, Declaration]] = {k: {} for k in KINDS}
    targets: list[tuple[str, str | None]] = []
    for package in BUILTIN_PACKAGES:
        targets += [(m, None) for m in declared.imported_modules(package) if (m, None) not in targets]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        module, _, attr = ep.value.partition(":")
        targets.append((module.strip(), attr.strip() or None))
    for module, attr in targets:
        for d in _declared_in(module, attr):
            _check_name(f"{d.module}.{d.qualname}", d.kind, d.name)
            known = out[d.kind].get(d.name)
            if known is not None and (known.module, known.qualname) != (d.module, d.qualname):
                raise ValueError(f"{d.kind} method {d.name!r} is registered twice: {known.module} and {d.module}")
            out[d.kind][d.name] = d
    return out


def _declared_in(module: str, attr: str | None) -> list[Declaration]:
    """The methods of ``module`` (its ``@register`` classes, or the class ``attr``):
    read from source, or imported where a value is not plain declared data."""
    try:
        if attr:
            refs = [declared.class_ref(module, attr)]
        else:
            refs = [c for c in declared.classes(module) if c.decorated_by(__name__, "register")]
        return [_declaration(ref.module, ref.name, ref.attribute) for ref in refs]
    except declared.NotDeclarative:
        loaded = importlib.import_module(module)
        if attr:
            classes = [getattr(loaded, attr)]
        else:
            classes = [c for kind in KINDS for c in _REGISTRY[kind].values() if c.__module__ == module]
        return [_declaration(c.__module__, c.__qualname__, lambda a, c=c: getattr(c, a, declared.MISSING))
                for c in classes]


def _declaration(module: str, qualname: str, attribute) -> Declaration:
    hyperparameters = attribute("hyperparameters")
    return Declaration(
        kind=attribute("kind"), name=attribute("name"), module=module, qualname=qualname,
        hyperparameters=() if hyperparameters is declared.MISSING else tuple(hyperparameters),
        full_participation=attribute("full_participation") is True,
    )
