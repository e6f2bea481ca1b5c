"""The support graph's shared devices: who trains a cluster's model without using it,
and the evaluate stage's picture of it."""

import clusterfed.evaluation.plots as plots
from clusterfed.algorithms import helping_memberships


def test_helping_memberships_lists_each_device_a_cluster_lists_without_serving_it():
    """Rows 0 {0, 1, 2} and 1 {2, 3}, device 2 served by row 1: it helps row 0."""
    assert helping_memberships([{0, 1, 2}, {2, 3}], [0, 0, 1, 1]) == [(2, 1, 0)]
    assert helping_memberships([{0, 1, 2}, {2, 3}, {3}], [0, 0, 0, 2]) == [(2, 0, 1), (3, 2, 1)]
    assert helping_memberships([{0, 1}, {2}], [0, 0, 1]) == []  # a partition: nobody helps


def test_support_graph_draws_shared_devices(tmp_path, monkeypatch):
    """The evaluate stage's picture of an overlapping clustering: the shared device is
    counted in the panel's title and labels one arrow."""
    closed = []
    monkeypatch.setattr(plots.plt, "close", closed.append)
    clustering = {"clusters": [{"id": 7, "model_index": 0, "devices": [0, 1, 2], "supportive_clusters": []},
                               {"id": 9, "model_index": 1, "devices": [2, 3], "supportive_clusters": []}],
                  "model_of_device": [0, 0, 1, 1], "ground_truth_groups": [0, 0, 1, 1]}
    path = tmp_path / "faacl.png"
    plots.plot_support_graph({"seed 10": clustering}, path, title="absorbing")
    assert path.stat().st_size > 0
    ax = closed[0].axes[0]
    assert ax.get_title() == "seed 10: 2 clusters\n0 one-way edges, 1 helping membership"
    labels = sorted(t.get_text() for t in ax.texts if t.get_text())  # arrows are texts without one
    assert labels == ["1", "2", "3"]  # the violet arrow's count, then each node's size
