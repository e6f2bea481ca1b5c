"""Continual methods over timesteps of new data; importing registers the built-in ones."""

from clusterfed.continual.protocol import ContinualMethod, train_rounds
from clusterfed.continual.cfaacl import CFAACL
from clusterfed.continual.baselines import ContinualFedAvg, FedDrift, FedProxEWC
from clusterfed.continual.apd import FedProxAPD
from clusterfed.continual.fedweit import FedWeIT
from clusterfed.continual.ssgd import FedProxSSGD

__all__ = [
    "CFAACL", "ContinualFedAvg", "ContinualMethod", "FedDrift", "FedProxAPD", "FedProxEWC", "FedProxSSGD",
    "FedWeIT", "train_rounds",
]
