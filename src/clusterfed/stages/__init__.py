"""The pipeline's stages: partition -> coldstart, continual, unsupervised -> evaluate.

Each stage reads its inputs and writes exactly its declared outputs, at the paths a
:class:`~clusterfed.layout.RunLayout` names; everything else (federations, methods,
metrics) comes from the library, which writes no file. ``stages/*.py`` (DVC), the CLI
and the Prefect tasks call these same functions, so an experiment runs identically
from any of them. A stage writes into a temporary sibling and renames it into place
at the end: a failed stage leaves nothing half-written.
"""

from clusterfed.stages.coldstart import coldstart
from clusterfed.stages.continual import continual
from clusterfed.stages.evaluate import evaluate
from clusterfed.stages.partition import partition
from clusterfed.stages.unsupervised import unsupervised

__all__ = ["coldstart", "continual", "evaluate", "partition", "unsupervised"]
