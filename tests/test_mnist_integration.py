"""Integration on real MNIST (../shared/datasets) with the thesis' MNIST settings, scaled down."""

import pytest
from sklearn.metrics import adjusted_rand_score

from clusterfed.algorithms import FAACL
from clusterfed.engine import Engine, TrainingConfig
from clusterfed.scenarios import build_scenario

pytestmark = pytest.mark.mnist


@pytest.mark.parametrize("scenario", ["S1", "S2"])
def test_faacl_finds_the_two_concepts_on_mnist(mnist, scenario):
    fed = build_scenario(
        mnist, scenario, group_sizes=[4, 4], seed=10, samples_per_device=800, test_samples_per_device=300
    )
    engine = Engine(fed, training=TrainingConfig(lr=0.01, l2=0.001, batch_size=10), device="cpu")
    result = FAACL(alpha=0.1, epsilon=0.7, init_epochs=5, epochs=10).fit(engine, seed=10)
    assert result.n_clusters == 2
    assert adjusted_rand_score(fed.groups, result.model_of_device) == 1.0
    assert result.device_accuracy.mean() > 0.85
