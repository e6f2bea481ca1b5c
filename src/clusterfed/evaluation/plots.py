"""Pictures people would rather look at than read: curves over rounds or timesteps,
and each device's cluster over time."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from clusterfed.algorithms.clustering import helping_memberships  # noqa: E402

_LINESTYLES = ("-", "--", "-.", ":")
_HELPING, _BEND = "darkviolet", -0.25  # support graph: colour and arc of a shared-devices arrow
_MARKERS = ("o", "s", "^", "D", "v", "P")


def plot_curves(
    curves: dict[str, list[float]],
    path: Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    first_x: int = 0,
    ylim: tuple[float, float] | None = None,
    x: dict[str, list[float]] | None = None,
    integer_y: bool = False,
) -> None:
    """One line per algorithm (e.g. accuracy per round, or clusters per timestep);
    ``x`` gives each line its own abscissae (e.g. megabytes sent) instead of indices.

    Lines differ in style and marker as well as colour, so algorithms with equal
    values (two methods that both keep 2 clusters) stay visible on top of each other;
    ``integer_y`` keeps counts on whole-number ticks.
    """
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, values) in enumerate(curves.items()):
        xs = x[name] if x is not None else range(first_x, first_x + len(values))
        ax.plot(
            xs,
            values,
            linestyle=_LINESTYLES[i % len(_LINESTYLES)],
            marker=_MARKERS[i % len(_MARKERS)] if len(values) < 30 else None,
            markersize=max(3.0, 9.0 - 2.0 * i),  # later (on top) lines smaller: all show
            label=name,
        )
    if integer_y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_assignments(clusters: np.ndarray, concepts: np.ndarray, path: Path, *, title: str) -> None:
    """Each device's cluster over time (colour, keyed by cluster id beside the grid), with
    its concept written in the cell. Colours repeat after 20 clusters; the key says which."""
    ids = {c: i for i, c in enumerate(dict.fromkeys(clusters.flatten().tolist()))}
    grid = np.vectorize(ids.get)(clusters) % 20
    palette = plt.get_cmap("tab20").colors
    n_devices, n_t = grid.shape
    fig, ax = plt.subplots(figsize=(2.6 + 0.5 * n_t, 1 + 0.3 * max(n_devices, len(ids) * 0.8)))
    ax.imshow(grid, cmap=ListedColormap(palette), aspect="auto", interpolation="nearest", vmin=0, vmax=19)
    for d in range(n_devices):
        for t in range(n_t):
            ax.text(t, d, str(concepts[d, t]), ha="center", va="center", fontsize=7)
    ax.set_xlabel("timestep (cell text: the device's concept)")
    ax.set_ylabel("device")
    ax.set_xticks(range(n_t))
    ax.set_title(title, fontsize=9)
    key = [Patch(facecolor=palette[i % 20], label=f"cluster {c}") for c, i in ids.items()]
    ax.legend(handles=key, title="colour", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              title_fontsize=7, frameon=False, ncol=1 + len(key) // 25)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_support_graph(panels: dict[str, dict], path: Path, *, title: str) -> None:
    """The asymmetric support graph (thesis §3.2.2): one node per cluster, its area
    proportional to its devices and its colour the ground-truth group most of them
    belong to; an arrow from a supporter to the cluster it supports, solid when the
    support is one-way, dashed grey when mutual. Where clusters share devices
    (FAACL's ``merge="absorbing"``), a violet arrow goes from the cluster serving some
    devices to another cluster that lists them, labelled with how many: their data
    trains a model they do not use (``helping_memberships``).

    ``panels`` maps a panel title (e.g. a seed) to a ``clustering.json`` dict
    (``clusters`` with ``id``, ``model_index``, ``devices``, ``supportive_clusters``;
    ``model_of_device``; optional ``ground_truth_groups``).
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    cmap = plt.get_cmap("tab10")
    for ax, (name, clustering) in zip(axes[0], panels.items()):
        clusters = clustering["clusters"]
        groups = clustering.get("ground_truth_groups")
        n = len(clusters)
        angle = 2 * np.pi * np.arange(n) / max(n, 1) + np.pi / 2
        pos = {c["id"]: (np.cos(a), np.sin(a)) if n > 1 else (0.0, 0.0) for c, a in zip(clusters, angle)}
        sup = {c["id"]: set(c["supportive_clusters"]) for c in clusters}
        one_way = 0
        for c in clusters:
            for s in c["supportive_clusters"]:
                if s not in pos:
                    continue
                mutual = c["id"] in sup.get(s, set())
                one_way += not mutual
                ax.annotate(
                    "", xy=pos[c["id"]], xytext=pos[s],
                    arrowprops=dict(
                        arrowstyle="-|>", lw=0.8 if mutual else 1.4, shrinkA=12, shrinkB=12,
                        color="0.6" if mutual else "C3", linestyle="--" if mutual else "-",
                        connectionstyle="arc3,rad=0.12",
                    ),
                )
        helping = helping_memberships([c["devices"] for c in clusters], clustering["model_of_device"])
        at_row = {c.get("model_index", i): pos[c["id"]] for i, c in enumerate(clusters)}
        arrows = Counter((serving, helped) for _, serving, helped in helping)
        for (serving, helped), count in arrows.items():
            if serving not in at_row:
                continue
            (x0, y0), (x1, y1) = at_row[serving], at_row[helped]
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(
                arrowstyle="-|>", lw=1.0 + 0.4 * min(count, 5), shrinkA=12, shrinkB=12, color=_HELPING,
                connectionstyle=f"arc3,rad={_BEND}"))
            # the label sits on the arc (a quadratic Bézier's midpoint), so two opposite arrows keep theirs apart
            ax.text((x0 + x1) / 2 + _BEND * (y1 - y0) / 2, (y0 + y1) / 2 - _BEND * (x1 - x0) / 2, str(count),
                    color=_HELPING, fontsize=7, ha="center", va="center", zorder=5,
                    bbox=dict(boxstyle="round,pad=0.1", fc="w", ec="none"))
        for c in clusters:
            devices = c["devices"]
            colour = "0.7"
            if groups is not None and devices:
                colour = cmap(int(np.bincount([groups[d] for d in devices]).argmax()) % 10)
            x, y = pos[c["id"]]
            ax.scatter([x], [y], s=60 + 40 * len(devices), color=colour, edgecolor="k", zorder=3, alpha=0.9)
            ax.text(x, y, str(len(devices)), ha="center", va="center", fontsize=7, zorder=4)
        shared = f", {len(helping)} helping membership{'s' * (len(helping) != 1)}" if helping else ""
        ax.set_title(f"{name}: {n} clusters\n{one_way} one-way edges{shared}", fontsize=9)
        ax.set_xlim(-1.5, 1.5)
        ax.set_ylim(-1.5, 1.5)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(title + "\nnode: cluster (area, number = devices; colour = main ground-truth group)"
                 "\narrow: supporter → supported (red one-way, grey dashed mutual); violet: serving cluster → "
                 "a cluster its devices also train (count)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
