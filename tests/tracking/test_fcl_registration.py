"""FedWeIT registers each device's composed model per timestep: the registry answers
"which model serves device d at time t" with that device's own model."""

import json

import numpy as np
import torch
from safetensors.torch import load_file

from clusterfed import stages
from clusterfed.config import parse_params
from clusterfed.layout import RunLayout, saved_checkpoints
from clusterfed.models import MLP
from clusterfed.scenarios import Federation
from clusterfed.tracking import get_client, lookup, track_outputs
from clusterfed.tracking.registry import load_model

PARAMS = {
    "seeds": [10],
    "training": {"lr": 0.05, "device": "cpu"},
    "coldstart": {"algorithms": ["fedavg"], "rounds": 1},
    "continual": {"algorithms": ["fedweit"], "timesteps": 1, "rounds": 2, "samples_per_device": 40,
                  "test_samples_per_device": 10},
    "unsupervised": {"enabled": False},
}


def test_fedweit_serves_each_device_its_composed_model_at_each_timestep(tmp_path):
    params, layout = parse_params(PARAMS), RunLayout(tmp_path / "run")
    stages.partition(params, layout)
    stages.coldstart(params, layout, progress=False)
    stages.continual(params, layout, progress=False)
    stages.evaluate(params, layout)
    track_outputs(params, layout, root=tmp_path / "store")
    client = get_client(tmp_path / "store")
    x = torch.as_tensor(Federation.load(layout.partition(10)).devices[0].x_test)
    run = layout.continual_run("fedweit", 10)
    rows = json.loads(run.timesteps.read_text())["rows"]
    for checkpoint, row in zip(saved_checkpoints(run.checkpoints), rows, strict=True):
        composed = {k.removeprefix("params."): v for k, v in load_file(str(checkpoint.tensors)).items()
                    if k.startswith("params.")}
        for d in range(10):
            served = lookup(client, d, experiment="clusterfed-digits-S2", stage="continual", algorithm="fedweit",
                            seed=10, timestep=row["t"])
            assert served.devices == [d] and served.timestep == row["t"]
            expected = MLP.stacked_forward({k: v[d : d + 1] for k, v in composed.items()}, x, shared_input=True)[0]
            assert np.array_equal(load_model(client, served).predict(x.numpy()), expected.argmax(-1).numpy())
