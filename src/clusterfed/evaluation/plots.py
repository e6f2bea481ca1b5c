"""Pictures people would rather look at than read: accuracy per round."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_accuracy(curves: dict[str, list[float]], path: Path, *, title: str) -> None:
    """Mean test accuracy per round, one line per algorithm."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, acc in curves.items():
        ax.plot(range(1, len(acc) + 1), acc, label=name)
    ax.set_xlabel("communication round")
    ax.set_ylabel("mean device test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
