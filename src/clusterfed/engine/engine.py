"""The shared engine: local training, aggregation and evaluation of many models at once.

Algorithms describe *which* model trains on *which* device's data (pairs) and how
results are averaged; the engine runs all pairs in batched tensor operations
(DESIGN.md §6). No algorithm loops over devices to train them one by one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from clusterfed.engine.aggregation import weighted_average
from clusterfed.engine.composed import Composition, composed_sgd
from clusterfed.engine.evaluation import (
    EVAL_BUDGET_BYTES,
    activation_floats,
    all_pairs_losses,
    mean_loss_gradients,
    own_model_accuracy,
    own_model_losses,
)
from clusterfed.engine.local_sgd import LocalObjective, QuadraticPenalty, local_sgd, squared_gradients
from clusterfed.engine.robust import RobustRule, screen
from clusterfed.engine.stacked import StackedParams, init_stacked
from clusterfed.engine.tensors import FederationTensors, PaddedSplit, pooled
from clusterfed.models import CONV_CHANNELS, KERNEL_SIZE, build_model, is_regularized
from clusterfed.scenarios import Federation

#: How a round's pairs of one model train (``Engine.train``): all from the model at once,
#: or one after another, each from the previous one's upload.
Visit = Literal["parallel", "sequential"]

#: The largest upload buffer ``Engine.train`` keeps between rounds (larger rounds write
#: fresh tensors): 2 GiB holds 5000 pairs of the thesis MLP.
UPLOAD_BUFFER_BYTES = 2 * 2**30


@dataclass(frozen=True)
class Round:
    """What one engine call returns: the parameters, and the pairs whose upload the
    screening (``engine/robust.py``, DESIGN.md §8) rejected — indices into the call's
    pairs, whose devices are ``devices[rejected]`` — for the caller to act on."""

    params: StackedParams
    rejected: np.ndarray  # pair indices, ascending
    devices: np.ndarray  # the device of every pair screened (one upload each)

    @property
    def n_rejected(self) -> int:
        return len(self.rejected)

    @property
    def uploads(self) -> int:
        return len(self.devices)

    @property
    def rejected_devices(self) -> np.ndarray:
        return self.devices[self.rejected]


@dataclass(eq=False)
class Tally:
    """The uploads screened, and those rejected per device, by the engine calls made
    while it was open (``Engine.tally``): how a driver learns what the calls inside a
    method's hooks rejected without the method passing it on. Pooled virtual devices
    (ids ≥ ``n_devices``) count as uploads only."""

    n_devices: int
    uploads: int = 0
    rejected_by_device: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.rejected_by_device is None:
            self.rejected_by_device = np.zeros(self.n_devices, dtype=np.int64)

    def add(self, round_: Round) -> None:
        self.uploads += round_.uploads
        devices = round_.rejected_devices
        np.add.at(self.rejected_by_device, devices[devices < self.n_devices], 1)

    def resume(self, uploads: int, rejected_by_device: np.ndarray) -> None:
        """Carry on from counts taken before a snapshot (a resumed fit)."""
        self.uploads += int(uploads)
        self.rejected_by_device += np.asarray(rejected_by_device, dtype=np.int64)

    @property
    def rejected(self) -> int:
        return int(self.rejected_by_device.sum())

    def rejected_devices(self) -> list[int]:
        """One entry per rejected upload, device ids ascending."""
        return np.repeat(np.arange(self.n_devices), self.rejected_by_device).tolist()


@dataclass(frozen=True)
class TrainingConfig:
    """Local SGD of thesis appendix B.3 / B.4 (MNIST: lr 0.01, L2 0.001, batch 10)."""

    lr: float = 0.01
    l2: float = 0.001
    batch_size: int = 10
    local_epochs: int = 1


def select_device(name: str = "auto") -> torch.device:
    """CUDA when available (``auto``), else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class Engine:
    """Batched training and evaluation over one federation's data.

    Parameters
    ----------
    federation : Federation
    model : {"mlp", "cnn"}
    training : TrainingConfig
    hidden : int, default=128
        Hidden width of the model.
    conv_channels : tuple of int, default=(16, 32)
        Channels of the CNN's two convolutions (the MLP ignores them).
    kernel_size : int, default=3
        Odd kernel size of the CNN's convolutions.
    device : str, default="auto"
    workers : int, optional
        Chunks of MLP pairs trained at once on their own threads (``local_sgd``);
        default torch's intra-op thread count at the call: one chunk per core, since a
        batch-10 step is too small to split over cores. Results do not depend on it.
    sparse_inputs : bool, default=False
        Plain local SGD steps of the MLP on CPU read and update only the first layer's
        weights at the inputs that differ from their feature's most common value
        (``engine/sparse_mlp.py``): the same steps up to float rounding, faster on
        MNIST's pixels, raw or standardised. Pulls with one weight per tensor
        (FedProx, Ditto, StoCFL) included; EWC's, Per-FedAvg's and pFedMe's steps,
        and CUDA, keep the dense kernel.
    """

    def __init__(
        self,
        federation: Federation,
        *,
        model: str = "mlp",
        training: TrainingConfig = TrainingConfig(),
        hidden: int = 128,
        conv_channels: tuple[int, int] = CONV_CHANNELS,
        kernel_size: int = KERNEL_SIZE,
        device: str = "auto",
        screening: RobustRule = RobustRule(),
        workers: int | None = None,
        sparse_inputs: bool = False,
    ) -> None:
        if sparse_inputs and model != "mlp":
            raise ValueError(f"training.sparse_inputs: the sparse kernel is the MLP's; model.name is {model!r}")
        self.device = select_device(device)
        self.workers = workers
        self.sparse_inputs = sparse_inputs
        self.screening = screening
        self.training = training
        self.model: nn.Module = build_model(
            model,
            federation.input_shape,
            federation.n_classes,
            hidden=hidden,
            conv_channels=conv_channels,
            kernel_size=kernel_size,
        ).to(self.device)
        self.data = FederationTensors.from_federation(federation, self.device)
        self.n_devices = federation.n_devices
        self.n_classes = federation.n_classes
        self._tallies: list[Tally] = []  # open Engine.tally scopes
        self._buffer: StackedParams = {}  # train's uploads, reused from round to round
        # (model, sample) rows per evaluation forward: its activations stay within the budget
        self.eval_rows = max(1, EVAL_BUDGET_BYTES // (4 * activation_floats(self.model, federation.input_shape)))

    def init_params(self, n_models: int, generator: torch.Generator, *, distinct: bool) -> StackedParams:
        """``n_models`` starting models: one shared random θ (thesis Alg. 1) or distinct draws."""
        return init_stacked(self.model, n_models, generator, distinct=distinct, device=self.device)

    def train(
        self,
        params: StackedParams,
        model_of_pair: np.ndarray,
        device_of_pair: np.ndarray,
        generator: torch.Generator,
        *,
        local_epochs: int | None = None,
        data: PaddedSplit | None = None,
        penalty: QuadraticPenalty | None = None,
        training: TrainingConfig | None = None,
        objective: LocalObjective | None = None,
        pair_weight: np.ndarray | None = None,
        visit: Visit = "parallel",
    ) -> Round:
        """One communication round (thesis Alg. 4): pair p trains model ``model_of_pair[p]``
        locally on device ``device_of_pair[p]``, then each model becomes the
        |Z_d^train|-weighted average of its pairs. Models without pairs are unchanged.
        ``visit="sequential"``: each model's pairs train one after another instead, in
        the order given, each from the model the previous one uploaded
        (:meth:`chained_models`), and the model becomes the average of that sequence.

        Pairs whose upload is rejected (``engine/robust.py``: not finite, or a norm
        outlier against the call's other updates) are left out of the average and
        returned in ``Round.rejected`` (DESIGN.md §8), so one device cannot poison a model.
        ``data`` replaces the federation's training split (e.g. pooled groups);
        ``penalty`` (one row per model) adds a quadratic pull (FedProx, EWC);
        ``training`` replaces the engine's SGD settings for this round;
        ``objective`` replaces plain SGD by Per-FedAvg's or pFedMe's local step;
        ``pair_weight`` multiplies pair p's |Z_d^train| in the average.
        """
        data = self.data.train if data is None else data
        if len(model_of_pair) == 0:
            return Round(params, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        if visit == "sequential":
            uploads = self.chained_models(
                params, model_of_pair, device_of_pair, generator,
                local_epochs=local_epochs, data=data, penalty=penalty, training=training, objective=objective,
            )
        elif visit == "parallel":
            uploads = self._local_models(
                params, model_of_pair, device_of_pair, generator,
                local_epochs=local_epochs, data=data, penalty=penalty, training=training, objective=objective,
                buffer=self._uploads_buffer(params, len(model_of_pair)),  # averaged below, then free to reuse
            )
        else:
            raise ValueError(f"visit: expected 'parallel' or 'sequential', got {visit!r}")
        averaged = self.aggregate(
            uploads.params, model_of_pair, device_of_pair, params,
            rejected=uploads.rejected, data=data, pair_weight=pair_weight,
        )
        return Round(averaged, uploads.rejected, uploads.devices)

    def aggregate(
        self,
        uploads: StackedParams,
        model_of_pair: np.ndarray,
        device_of_pair: np.ndarray,
        previous: StackedParams,
        *,
        rejected: np.ndarray | None = None,
        data: PaddedSplit | None = None,
        pair_weight: np.ndarray | None = None,
    ) -> StackedParams:
        """Each model becomes the |Z_d^train|-weighted average (times ``pair_weight``)
        of the uploads of its pairs not ``rejected`` (thesis Alg. 4, last line); a
        model without one keeps ``previous``. Pure: no input is modified."""
        data = self.data.train if data is None else data
        model_idx = torch.as_tensor(model_of_pair, dtype=torch.long, device=self.device)
        device_idx = torch.as_tensor(device_of_pair, dtype=torch.long, device=self.device)
        weights = data.counts.to(torch.float32)[device_idx]
        if pair_weight is not None:
            weights = weights * torch.as_tensor(pair_weight, dtype=torch.float32, device=self.device)
        trained = uploads
        if rejected is not None and len(rejected):
            ok = torch.ones(len(model_idx), dtype=torch.bool, device=self.device)
            ok[torch.as_tensor(rejected, dtype=torch.long, device=self.device)] = False
            weights = torch.where(ok, weights, torch.zeros_like(weights))
            trained = {k: torch.where(_expand(ok, v), v, 0.0) for k, v in trained.items()}
        return weighted_average(trained, model_idx, weights, previous)

    def local_models(
        self,
        params: StackedParams,
        model_of_pair: np.ndarray,
        device_of_pair: np.ndarray,
        generator: torch.Generator,
        *,
        local_epochs: int | None = None,
        data: PaddedSplit | None = None,
        penalty: QuadraticPenalty | None = None,
        training: TrainingConfig | None = None,
        objective: LocalObjective | None = None,
    ) -> Round:
        """The model each pair uploads: ``model_of_pair[p]`` after local SGD on device
        ``device_of_pair[p]``, one row per pair, not averaged (``train`` averages them;
        FLACC and FedClust read them one by one). ``training`` replaces the engine's SGD
        settings (e.g. a newcomer trained as the federation's devices were). Uploads the
        screening refuses are NaN rows listed in ``Round.rejected``."""
        return self._local_models(
            params, model_of_pair, device_of_pair, generator,
            local_epochs=local_epochs, data=data, penalty=penalty, training=training, objective=objective,
        )

    def chained_models(
        self,
        params: StackedParams,
        model_of_pair: np.ndarray,
        device_of_pair: np.ndarray,
        generator: torch.Generator,
        *,
        local_epochs: int | None = None,
        data: PaddedSplit | None = None,
        penalty: QuadraticPenalty | None = None,
        training: TrainingConfig | None = None,
        objective: LocalObjective | None = None,
    ) -> Round:
        """What each pair uploads when each model's pairs visit their devices in turn:
        the i-th pair of model m (in the order given) starts from what the (i−1)-th
        uploaded, the first from ``params``' row m. One row per pair, as ``local_models``.

        This is how the StoCFL authors' code trains its global model ω in a round
        (``RotatedMNISTTrainer.train`` of dunzeng/StoCFL: each sampled client trains the
        model the previous client returned), which their FedAvg row reads. The i-th
        pairs of all models train in one batched call, so a call costs as many steps in
        sequence as the longest chain. Each of those calls is screened on its own: with
        one chain (FedAvg) only non-finite uploads are rejected, since the norm rule
        needs a call's other updates; a rejected pair is passed over, and the next
        starts from the last accepted model."""
        model_of_pair = np.asarray(model_of_pair)
        device_of_pair = np.asarray(device_of_pair)
        n_pairs = len(model_of_pair)
        order = np.argsort(model_of_pair, kind="stable")
        first = np.r_[0, np.flatnonzero(np.diff(model_of_pair[order])) + 1]
        position = np.empty(n_pairs, dtype=np.int64)
        position[order] = np.arange(n_pairs) - np.repeat(first, np.diff(np.r_[first, n_pairs]))
        current = dict(params)  # row m: what model m's chain hands on next (replaced, never written in place)
        uploads: StackedParams = {}
        rejected: list[np.ndarray] = []
        for step in range(int(position.max()) + 1 if n_pairs else 0):
            pairs = np.flatnonzero(position == step)
            models = model_of_pair[pairs]
            result = self._local_models(
                current, models, device_of_pair[pairs], generator, local_epochs=local_epochs, data=data,
                penalty=penalty, training=training, objective=objective,
            )
            if not uploads:
                uploads = {k: v.new_empty((n_pairs, *v.shape[1:])) for k, v in result.params.items()}
            index = torch.as_tensor(pairs, dtype=torch.long, device=self.device)
            for k, v in result.params.items():
                uploads[k].index_copy_(0, index, v)
            keep = np.setdiff1d(np.arange(len(pairs)), result.rejected)
            rows = torch.as_tensor(models[keep], dtype=torch.long, device=self.device)
            kept = torch.as_tensor(keep, dtype=torch.long, device=self.device)
            current = {k: v.index_copy(0, rows, result.params[k].index_select(0, kept)) for k, v in current.items()}
            rejected.append(pairs[result.rejected])
        rejected_pairs = np.sort(np.concatenate(rejected)) if rejected else np.zeros(0, dtype=np.int64)
        return Round(uploads, rejected_pairs, device_of_pair)

    def _uploads_buffer(self, params: StackedParams, n_pairs: int) -> StackedParams | None:
        """The tensors ``train`` writes its uploads into, kept from round to round (grown
        by a quarter when a round has more pairs), so that each round writes P·|θ|
        floats into memory already mapped rather than fresh pages (``local_sgd``).
        None (fresh tensors each round) above ``UPLOAD_BUFFER_BYTES``: memory held
        between rounds is then worth more than the page faults (StoCFL's N = 4800 with
        the 784-2048-10 MLP: 6.3 GB a round)."""
        per_pair = sum(v[0].numel() * v.element_size() for v in params.values())
        if (n_pairs + n_pairs // 4) * per_pair > UPLOAD_BUFFER_BYTES:
            self._buffer = {}
            return None
        buffer = self._buffer
        if (not buffer or len(next(iter(buffer.values()))) < n_pairs
                or any(k not in buffer or buffer[k].shape[1:] != v.shape[1:] or buffer[k].dtype != v.dtype
                       for k, v in params.items())):
            self._buffer = buffer = {}  # the old one is freed before the new one is made
            rows = max(n_pairs, n_pairs + n_pairs // 4)
            buffer.update({k: v.new_empty((rows, *v.shape[1:])) for k, v in params.items()})
        return buffer

    def _local_models(self, params, model_of_pair, device_of_pair, generator, *, local_epochs, data, penalty,
                      training, objective, buffer: StackedParams | None = None) -> Round:
        data = self.data.train if data is None else data
        cfg = self.training if training is None else training
        model_idx = torch.as_tensor(model_of_pair, dtype=torch.long, device=self.device)
        device_idx = torch.as_tensor(device_of_pair, dtype=torch.long, device=self.device)
        trained, norms = local_sgd(
            self.model,
            params,
            data,
            device_idx,
            epochs=cfg.local_epochs if local_epochs is None else local_epochs,
            lr=cfg.lr,
            l2=cfg.l2,
            batch_size=cfg.batch_size,
            generator=generator,
            penalty=penalty,  # one row per model: local_sgd pulls each pair to its model's row
            model_of_pair=model_idx,
            objective=objective,
            workers=self.workers,
            start_rows=model_idx,  # the pairs' one copy of their models is made there
            return_norms=True,  # the screening's update norms, taken while each chunk is in cache
            buffer=buffer,
            sparse=self.sparse_inputs,
        )
        # Pooled rows are no device's: their uploads count against nobody (Tally).
        uploaders = np.asarray(device_of_pair) + self.n_devices if data.virtual else device_of_pair
        return self.screen(trained, uploaders, params, start_rows=model_idx, norms=norms)

    def local_composed(
        self,
        variables: StackedParams,
        composition: Composition,
        device_of_pair: np.ndarray,
        generator: torch.Generator,
        *,
        local_epochs: int | None = None,
        training: TrainingConfig | None = None,
        dropout: float = 0.0,
        adam: bool = False,
    ) -> Round:
        """What each pair uploads when its model is composed from variables (APD,
        FedWeIT, ``engine/composed.py``): pair p trains row p of ``variables`` on device
        ``device_of_pair[p]``, its model being ``composition.compose(variables)``;
        ``dropout`` masks hidden activations (Stable SGD); ``adam`` steps by Adam at the
        training's lr instead of SGD (``composed_sgd``). One row per pair, not
        averaged (the method aggregates what it shares); screened as ``local_models``'
        (rejected rows NaN, listed in ``Round.rejected``)."""
        cfg = self.training if training is None else training
        device_idx = torch.as_tensor(device_of_pair, dtype=torch.long, device=self.device)
        trained = composed_sgd(
            self.model, variables, composition, self.data.train, device_idx,
            epochs=cfg.local_epochs if local_epochs is None else local_epochs,
            lr=cfg.lr, l2=cfg.l2, batch_size=cfg.batch_size, generator=generator, dropout=dropout, adam=adam,
        )
        return self.screen(trained, device_of_pair, variables)

    def screen(
        self,
        uploads: StackedParams,
        device_of_pair: np.ndarray,
        start: StackedParams | None = None,
        *,
        start_rows: torch.Tensor | None = None,
        norms: torch.Tensor | None = None,
    ) -> Round:
        """The one rejection point (``robust.screen`` with this engine's rule), row p
        uploaded by device ``device_of_pair[p]``: rejected rows come back NaN (so no
        later finite check can take them), accepted ones clipped when the rule says so;
        reported to every open ``tally``. The engine's calls screen what they return
        (models, Fisher estimates, gradients); a method screens here what a device
        computes without the engine (PACFL's data bases). ``start``: the models the
        rows began from (the rule then judges the update θ_p − start_p); with
        ``start_rows``, row p began from ``start``'s row ``start_rows[p]``; ``norms``: the
        update norms when the caller took them already (``local_sgd(return_norms=True)``)."""
        rejected, uploads = screen(uploads, start, self.screening, rows=start_rows, norms=norms)
        result = Round(uploads, torch.nonzero(rejected).flatten().cpu().numpy(), np.asarray(device_of_pair))
        for tally in self._tallies:
            tally.add(result)
        return result

    @contextmanager
    def tally(self) -> Iterator[Tally]:
        """Count what every engine call inside the ``with`` block screened and rejected
        (scopes nest: an outer tally sees the inner calls too)."""
        tally = Tally(self.n_devices)
        self._tallies.append(tally)
        try:
            yield tally
        finally:
            self._tallies.remove(tally)

    def fisher(self, params: StackedParams, model_of_pair: np.ndarray, device_of_pair: np.ndarray) -> Round:
        """Diagonal empirical Fisher of each model, averaged over its pairs' devices
        weighted by |Z^train| (as the server would aggregate it); each pair's estimate
        is an upload screened like any other (one device's NaN data poisons no Fisher)."""
        model_idx = torch.as_tensor(model_of_pair, dtype=torch.long, device=self.device)
        device_idx = torch.as_tensor(device_of_pair, dtype=torch.long, device=self.device)
        start = {k: v.index_select(0, model_idx) for k, v in params.items()}
        squares = squared_gradients(
            self.model, start, self.data.train, device_idx, batch_size=self.training.batch_size
        )
        screened = self.screen(squares, device_of_pair)
        zeros = {k: torch.zeros_like(v) for k, v in params.items()}
        fisher = self.aggregate(screened.params, model_of_pair, device_of_pair, zeros, rejected=screened.rejected)
        return Round(fisher, screened.rejected, screened.devices)

    def counts(self, split: str = "train") -> np.ndarray:
        """Samples of each device in ``split`` (|Z_d^train| for ``"train"``)."""
        return self.data.split(split).counts.cpu().numpy()

    def samples(self, split: str, device: int) -> tuple[np.ndarray, np.ndarray]:
        """Device ``device``'s inputs and labels of ``split`` (e.g. for a memory sample)."""
        data = self.data.split(split)
        n = int(data.counts[device])
        return data.x[device, :n].cpu().numpy(), data.y[device, :n].cpu().numpy()

    def mask(self, split: str = "train") -> torch.Tensor:
        """``[n_devices, max_n]`` bool, True on each device's real samples (the last
        axis of ``losses``)."""
        return self.data.split(split).mask

    def head(self, n: int) -> PaddedSplit:
        """Each device's first ``n`` training samples, as ``data=`` for a round."""
        t = self.data.train
        return PaddedSplit(x=t.x[:, :n], y=t.y[:, :n], counts=t.counts.clamp(max=n))

    def pooled(self, pools: Sequence[np.ndarray]) -> PaddedSplit:
        """The training data of each pool of devices pooled into one virtual device (for ``data=``)."""
        return pooled(self.data.train, pools)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of each parameter of one model of this engine's architecture."""
        return {k: tuple(v.shape) for k, v in self.model.named_parameters()}

    def gradients(self, params: StackedParams, devices: np.ndarray | None = None, *, chunk: int = 64) -> np.ndarray:
        """Full-batch gradient of the mean training loss of the one model ``params`` on
        each device's data, flattened in ``params``' key order, ``[len(devices), d]``;
        each row is a device's upload, screened (a rejected row is NaN)."""
        devices = np.arange(self.n_devices) if devices is None else np.asarray(devices, dtype=np.int64)
        gradients = mean_loss_gradients(self.model, params, self.data.train, devices, chunk=chunk)
        if len(devices) == 0:
            return gradients
        screened = self.screen({"gradient": torch.as_tensor(gradients)}, devices)  # each row is an upload
        return screened.params["gradient"].numpy()

    def losses(
        self, params: StackedParams, split: str = "val", *, devices: np.ndarray | None = None,
        measure: str = "cross_entropy",
    ) -> torch.Tensor:
        """Per-sample losses ``[M, len(devices), max_n]`` of every model on the split of
        ``devices`` (default: every device); padding entries are 0. ``measure`` is
        ``cross_entropy`` or ``zero_one`` (1 for a wrong prediction). Only the requested
        devices are evaluated, in forwards of at most ``eval_rows`` (model, sample) rows,
        so the working memory beyond the output is bounded (``all_pairs_losses``)."""
        index = None if devices is None else torch.as_tensor(devices, dtype=torch.long, device=self.device)
        return all_pairs_losses(
            self.model, params, self.data.split(split), devices=index, max_rows=self.eval_rows, measure=measure
        )

    def penalties(self, params: StackedParams) -> np.ndarray:
        """Each model's L2 penalty ``l2 · Σ‖kernel‖²`` ``[M]``: the term training adds to
        the data loss (Keras' ``kernel_regularizer``, whose ``evaluate`` reports it
        inside every loss it returns)."""
        total = np.zeros(len(next(iter(params.values()))))
        for name, v in params.items():
            if is_regularized(name):
                total += v.detach().double().pow(2).flatten(1).sum(1).cpu().numpy()
        return self.training.l2 * total

    def own_losses(self, params: StackedParams, model_of_device: np.ndarray, split: str = "val") -> torch.Tensor:
        """Per-sample losses ``[n_devices, max_n]`` of each device's own model on its split."""
        idx = torch.as_tensor(model_of_device, dtype=torch.long, device=self.device)
        return own_model_losses(self.model, params, idx, self.data.split(split))

    def sample_losses(self, params: StackedParams, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-sample losses ``[M, N]`` of every model on arbitrary samples (e.g. memory)."""
        split = PaddedSplit(
            x=torch.as_tensor(x, device=self.device)[None],
            y=torch.as_tensor(y, device=self.device)[None],
            counts=torch.as_tensor([len(y)], device=self.device),
        )
        return all_pairs_losses(self.model, params, split, max_rows=self.eval_rows)[:, 0].cpu().numpy()

    def mean_losses(
        self, params: StackedParams, split: str = "train", *, devices: np.ndarray | None = None,
        measure: str = "cross_entropy",
    ) -> torch.Tensor:
        """Mean loss ``[M, len(devices)]`` of every model on the split of ``devices``
        (default: every device); with ``measure="zero_one"``, the error rate."""
        data = self.data.split(split)
        mask, counts = data.mask, data.counts
        if devices is not None:
            index = torch.as_tensor(devices, dtype=torch.long, device=self.device)
            mask, counts = mask[index], counts[index]
        return (self.losses(params, split, devices=devices, measure=measure) * mask).sum(-1) / counts.clamp(min=1)

    def accuracy(
        self, params: StackedParams, model_of_device: np.ndarray, split: str = "test"
    ) -> np.ndarray:
        """Accuracy of each device's own model on its split, ``[n_devices]``."""
        idx = torch.as_tensor(model_of_device, dtype=torch.long, device=self.device)
        return own_model_accuracy(self.model, params, idx, self.data.split(split)).cpu().numpy()


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(-1, *([1] * (like.dim() - 1)))
