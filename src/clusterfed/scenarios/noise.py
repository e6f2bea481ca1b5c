"""Image corruptions of the asymmetric data-quality scenario A1 (thesis Table B.3)."""

from __future__ import annotations

import numpy as np


def gaussian_and_salt_pepper(
    x: np.ndarray,
    *,
    mean: float,
    variance: float,
    density: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Add Gaussian noise, then salt & pepper noise, to images scaled to [0, 1].

    A share ``density`` of the pixels is replaced by 0 (pepper) or 1 (salt) with equal
    probability, as in the thesis' A1 partition; the result is clipped to [0, 1].
    """
    noisy = x + rng.normal(mean, np.sqrt(variance), size=x.shape)
    corrupted = rng.random(x.shape) < density
    salt = rng.random(x.shape) < 0.5
    noisy = np.where(corrupted, salt.astype(x.dtype), noisy)
    return np.clip(noisy, 0.0, 1.0).astype(np.float32)
