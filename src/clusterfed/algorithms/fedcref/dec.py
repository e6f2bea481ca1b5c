"""Deep Embedded Clustering (Xie et al. 2016), small, for fedcref §5.4.1.

FedCRef's realistic initial clustering (Table 1) is DEC run by each client with its
K_i, and its centralised baseline (Table 2) is DEC on the pooled data with K chosen
by silhouette score. DEC: pretrain an autoencoder, k-means on its embedding z, then
self-train encoder and centroids μ_j by minimising KL(P‖Q), with the Student-t
soft assignment q_ij ∝ (1 + ‖z_i − μ_j‖²)⁻¹ and the sharpened target
p_ij ∝ q_ij² / Σ_i q_ij, refreshed every ``update_interval`` steps, until fewer than
``tol`` of the labels change.

By default smaller than the original, to fit a shared CPU: a d-256-64-10 autoencoder
trained end to end with Adam. ``DEC_SHAPES["paper"]`` is the original's (and fedcref
§5.3's) d-500-500-2000-10 encoder, pretrained end to end with Adam at batch 256 as
common reimplementations do, not layer-wise as denoising autoencoders. As the paper does,
Global DEC reads the silhouette in a 2-D t-SNE map of the embedding (on a
sub-sample). Many DECs (one per client) run as one batch on stacked parameters.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.cluster import KMeans
from sklearn.manifold import TSNE
from sklearn.metrics import silhouette_score

from clusterfed.engine.autoencoder import encode, init_autoencoders, train_autoencoders
from clusterfed.engine.stacked import StackedParams
from clusterfed.evaluation.clustering_accuracy import clustering_accuracy
from clusterfed.scenarios.unsupervised import CategoryTruth, UnlabelledClients

# name -> the encoder's widths after d and the pretraining batch size
DEC_SHAPES: dict[str, dict] = {
    "small": {"hidden": (256, 64, 10), "pretrain_batch_size": 32},  # Keras' default batch
    "paper": {"hidden": (500, 500, 2000, 10), "pretrain_batch_size": 256},
}


def soft_assignment(z: torch.Tensor, μ: torch.Tensor) -> torch.Tensor:
    """Student-t q ``[M, N, K]`` of codes ``z [M, N, e]`` to centroids ``μ [M, K, e]``."""
    # squared distances written out: cdist's gradient is NaN at zero distance
    q = 1.0 / (1.0 + (z[:, :, None, :] - μ[:, None, :, :]).pow(2).sum(-1))
    return q / q.sum(-1, keepdim=True)


def target_distribution(q: torch.Tensor) -> torch.Tensor:
    """p_ij = (q_ij² / f_j) / Σ_j' (q_ij'² / f_j') with f_j = Σ_i q_ij (over each model's N)."""
    w = q.pow(2) / q.sum(-2, keepdim=True).clamp(min=1e-12)  # masked-out centroids stay 0
    return w / w.sum(-1, keepdim=True)


def dec(
    xs: list[np.ndarray],
    ks: list[int],
    *,
    seed: int,
    pretrain_epochs: int = 20,
    steps: int = 2000,
    update_interval: int = 140,
    batch_size: int = 256,  # of the KL phase
    tol: float = 0.001,
    lr: float = 0.01,
    pretrained: StackedParams | None = None,
    shape: str = "small",
) -> tuple[list[np.ndarray], list[np.ndarray], StackedParams]:
    """DEC on each dataset ``xs[m]`` with ``ks[m]`` clusters, all at once, with the
    autoencoder ``DEC_SHAPES[shape]``.

    Returns each dataset's labels, its final embedding and the pretrained encoders
    (pass them back as ``pretrained`` to rerun the clustering phase with other K).
    """
    if shape not in DEC_SHAPES:
        raise ValueError(f"DEC shape must be one of {sorted(DEC_SHAPES)}, got {shape!r}")
    hidden, pretrain_batch_size = DEC_SHAPES[shape]["hidden"], DEC_SHAPES[shape]["pretrain_batch_size"]
    gen = torch.Generator().manual_seed(seed)
    n_models, d = len(xs), xs[0].shape[1]
    x_all = torch.as_tensor(np.concatenate(xs), dtype=torch.float32)
    sizes = [len(x) for x in xs]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    index = torch.zeros(n_models, max(sizes), dtype=torch.long)
    for m, (s, n) in enumerate(zip(starts, sizes)):
        index[m, :n] = torch.arange(s, s + n)
    counts = torch.as_tensor(sizes)
    if pretrained is None:
        params = train_autoencoders(
            init_autoencoders(n_models, d, gen, hidden=hidden), x_all, index, counts,
            epochs=pretrain_epochs, lr=1e-3, batch_size=pretrain_batch_size, generator=gen, linear_code=True,
        )
        pretrained = params
    # the whole autoencoder is kept (encode reads the depth from it); only the
    # encoder layers and the centroids are trained by the KL phase
    encoder = {k: v.detach().clone() for k, v in pretrained.items()}
    k_max = max(ks)
    μ = torch.zeros(n_models, k_max, hidden[-1])
    valid_k = torch.arange(k_max)[None, :] < torch.as_tensor(ks)[:, None]
    labels = []
    with torch.no_grad():
        for m in range(n_models):
            z = _embed(encoder, m, x_all[index[m, : sizes[m]]])
            km = KMeans(ks[m], n_init=10, random_state=seed).fit(z)
            μ[m, : ks[m]] = torch.as_tensor(km.cluster_centers_, dtype=torch.float32)
            labels.append(km.labels_.copy())
    leaves = [v for k, v in encoder.items() if int(k[1:]) < len(hidden)] + [μ]
    for t in leaves:
        t.requires_grad_(True)
    opt = torch.optim.SGD(leaves, lr=lr, momentum=0.9)
    p_full: list[torch.Tensor] = []
    for step in range(steps):
        if step % update_interval == 0:
            with torch.no_grad():
                p_full, new_labels = [], []
                for m in range(n_models):
                    q = _masked_q(encoder, μ, m, x_all[index[m, : sizes[m]]], valid_k[m])
                    p_full.append(target_distribution(q[None])[0])
                    new_labels.append(q.argmax(-1).numpy())
                changed = np.mean(np.concatenate([a != b for a, b in zip(new_labels, labels)]))
                labels = new_labels
                if step > 0 and changed < tol:
                    break
        pick = torch.stack([torch.randint(0, n, (batch_size,), generator=gen) for n in sizes])
        xb = x_all[index.gather(1, pick)]
        z = encode(encoder, xb, linear_code=True)
        q = soft_assignment(z, μ).masked_fill(~valid_k[:, None, :], 0.0)
        q = q / q.sum(-1, keepdim=True)
        p = torch.stack([p_full[m][pick[m]] for m in range(n_models)])
        kl = (p * (p.clamp(min=1e-12).log() - q.clamp(min=1e-12).log())).sum(-1).mean(-1).sum()
        opt.zero_grad()
        kl.backward()
        opt.step()
    with torch.no_grad():
        embeddings = [_embed(encoder, m, x_all[index[m, : sizes[m]]]) for m in range(n_models)]
    return labels, embeddings, pretrained


def _embed(encoder: StackedParams, m: int, x: torch.Tensor) -> np.ndarray:
    one = {k: v[m : m + 1].detach() for k, v in encoder.items()}
    return encode(one, x[None], linear_code=True)[0].numpy()


def _masked_q(encoder: StackedParams, μ: torch.Tensor, m: int, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    z = torch.as_tensor(_embed(encoder, m, x))
    q = soft_assignment(z[None], μ[m : m + 1].detach())[0].masked_fill(~valid[None, :], 0.0)
    return q / q.sum(-1, keepdim=True)


def tsne_silhouette(z: np.ndarray, labels: np.ndarray, *, seed: int) -> float:
    """Silhouette of ``labels`` in a 2-D t-SNE map of ``z`` (-1 for a single cluster)."""
    if len(np.unique(labels)) < 2:
        return -1.0
    return float(silhouette_score(TSNE(2, init="pca", random_state=seed).fit_transform(z), labels))


def local_dec(clients: UnlabelledClients, *, seed: int, **kwargs) -> list[np.ndarray]:
    """Table 1's initial clustering: every client runs DEC on its own data with its K_i."""
    labels, _, _ = dec(list(clients.x), list(clients.k), seed=seed, **kwargs)
    return [np.asarray(q, dtype=np.int64) for q in labels]


def global_dec(
    clients: UnlabelledClients,
    truth: CategoryTruth,
    *,
    seed: int,
    k_range: tuple[int, ...] = tuple(range(6, 15)),
    silhouette_samples: int = 2000,
    **kwargs,
) -> dict:
    """Table 2's centralised baseline: all client data pooled, DEC for every K in
    ``k_range``, K chosen by the best silhouette score in a 2-D t-SNE map of the
    embedding (``silhouette_samples`` pooled samples). Scored by ACC on the pooled data
    and by the mean per-client ACC of the global labels."""
    x = np.concatenate(clients.x)
    y = np.concatenate(truth.y)
    rng = np.random.default_rng(seed)
    sample = rng.choice(len(x), size=min(silhouette_samples, len(x)), replace=False)
    per_k = {}
    pretrained = None
    for k in k_range:
        labels, embeddings, pretrained = dec([x], [k], seed=seed, pretrained=pretrained, **kwargs)
        score = tsne_silhouette(embeddings[0][sample], labels[0][sample], seed=seed)
        per_k[k] = (float(score), labels[0])
    best = max(per_k, key=lambda k: per_k[k][0])
    labels = per_k[best][1]
    bounds = np.cumsum([len(xi) for xi in clients.x])[:-1]
    per_client = [clustering_accuracy(a, b) for a, b in zip(np.split(labels, bounds), truth.y)]
    return {
        "k_found": int(best),
        "global_k": truth.n_categories,
        "acc_pooled": clustering_accuracy(labels, y),
        "acc_end": float(np.mean(per_client)),
        "silhouette": {int(k): v[0] for k, v in per_k.items()},
        "acc_pooled_by_k": {int(k): clustering_accuracy(v[1], y) for k, v in per_k.items()},
    }
