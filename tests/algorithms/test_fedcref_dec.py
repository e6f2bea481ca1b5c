"""Small DEC (Xie et al. 2016) as FedCRef's local clusterer and Global DEC baseline."""

import numpy as np
import pytest
import torch

from clusterfed.algorithms.fedcref.dec import (
    dec,
    global_dec,
    local_dec,
    soft_assignment,
    target_distribution,
    tsne_silhouette,
)
from clusterfed.evaluation.fedcref_scores import mean_accuracy
from clusterfed.scenarios.unsupervised import make_clients


def test_target_sharpens_the_soft_assignment():
    z = torch.tensor([[[0.0, 0.0], [0.1, 0.0], [2.0, 2.0]]])
    μ = torch.tensor([[[0.0, 0.0], [2.0, 2.0]]])
    q = soft_assignment(z, μ)
    p = target_distribution(q)
    torch.testing.assert_close(q.sum(-1), torch.ones(1, 3))
    torch.testing.assert_close(p.sum(-1), torch.ones(1, 3))
    assert (p.max(-1).values > q.max(-1).values).all()
    # q_ij ∝ 1 / (1 + ‖z_i − μ_j‖²): sample 0 sits on μ_0, 8 squared units from μ_1
    torch.testing.assert_close(q[0, 0], torch.tensor([9 / 10, 1 / 10]))


@pytest.fixture(scope="module")
def clients(digits):
    x = np.concatenate([digits.x_train, digits.x_test])
    y = np.concatenate([digits.y_train, digits.y_test])
    return make_clients(x.reshape(len(x), -1), y, n_clients=5, samples_per_category=60, overlap=0.0,
                        dirtiness=0.0, seed=0)


def test_local_dec_clusters_each_client_with_its_k(clients):
    unlabelled, truth = clients
    labels = local_dec(unlabelled, seed=0, pretrain_epochs=10, steps=150)
    assert [len(np.unique(q)) <= k for q, k in zip(labels, unlabelled.k)] == [True] * 5
    assert mean_accuracy(labels, truth) > 0.8


def test_paper_shape_is_the_original_dec_encoder(clients):
    """``shape="paper"``: d-500-500-2000-10 with a mirrored decoder (fedcref §5.3), 10-d
    codes; an unknown shape is refused by name."""
    unlabelled, _ = clients
    labels, embeddings, ae = dec(list(unlabelled.x[:2]), list(unlabelled.k[:2]), seed=0, pretrain_epochs=1,
                                 steps=0, shape="paper")
    assert [tuple(ae[f"w{layer}"].shape[1:]) for layer in range(8)] == [
        (64, 500), (500, 500), (500, 2000), (2000, 10), (10, 2000), (2000, 500), (500, 500), (500, 64)]
    assert [e.shape[1] for e in embeddings] == [10, 10]
    assert [len(np.unique(q)) for q in labels] == list(unlabelled.k[:2])
    with pytest.raises(ValueError, match="'huge'"):
        dec(list(unlabelled.x[:1]), [2], seed=0, shape="huge")


def test_global_dec_picks_k_by_silhouette(clients):
    unlabelled, truth = clients
    out = global_dec(unlabelled, truth, seed=0, k_range=(4, 6), pretrain_epochs=10, steps=50)
    assert out["k_found"] == max(out["silhouette"], key=out["silhouette"].get)
    assert set(out["acc_pooled_by_k"]) == {4, 6}
    assert 0.0 < out["acc_pooled"] <= 1.0 and out["global_k"] == 10


def test_tsne_silhouette_prefers_the_true_digits(digits):
    """Global DEC reads the silhouette in a 2-D t-SNE map (fedcref §5.4.1): the true
    labels of three digits score high there, a random relabelling of them near 0, a
    single cluster −1."""
    keep = np.isin(digits.y_train, (0, 1, 6))
    x, y = digits.x_train[keep].reshape(keep.sum(), -1), digits.y_train[keep]
    shuffled = np.random.default_rng(0).permutation(y)
    assert tsne_silhouette(x, y, seed=0) > 0.5
    assert abs(tsne_silhouette(x, shuffled, seed=0)) < 0.1
    assert tsne_silhouette(x, np.zeros_like(y), seed=0) == -1.0
