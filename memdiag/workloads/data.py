"""Synthetic data that behaves like the real thing where memory is concerned.

Token ids follow a Zipf law, as words in text do, so the number of distinct rows an embedding lookup
touches per batch is realistic. Every batch is a pure function of (seed, rank, step).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ZipfTokens:
    """Token ids in [0, vocab_size) with P(id = k) proportional to 1 / (k + 1) ** exponent."""

    def __init__(self, vocab_size: int, exponent: float = 1.1) -> None:
        weights = 1.0 / np.arange(1, vocab_size + 1, dtype=np.float64) ** exponent
        self._cdf = np.cumsum(weights / weights.sum())
        self.vocab_size = vocab_size

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        ids = np.searchsorted(self._cdf, rng.random(shape), side="right")
        return np.minimum(ids, self.vocab_size - 1).astype(np.int32)


def batch_rng(seed: int, rank: int, step: int) -> np.random.Generator:
    """Independent, reproducible stream for one rank's batch at one step."""
    return np.random.default_rng(np.random.SeedSequence([seed, rank, step]))
