"""What memdiag needs from Python 3.10 and later, on 3.9 too (TensorFlow 2.15 supports 3.9 to 3.11)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


def paired(first: Sequence[A], second: Sequence[B]) -> list[tuple[A, B]]:
    """``zip(first, second, strict=True)``: the pairs, or ValueError when the lengths differ."""
    if len(first) != len(second):
        raise ValueError(f"paired sequences of different lengths: {len(first)} and {len(second)}")
    return list(zip(first, second))
