"""Datasets loaded into NumPy arrays."""

from clusterfed.data.datasets import DATASETS, ArrayDataset, load_dataset, read_idx

__all__ = ["ArrayDataset", "DATASETS", "load_dataset", "read_idx"]
