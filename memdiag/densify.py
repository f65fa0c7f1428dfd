"""The densify policy applied to live TensorFlow gradients (the agent's hooks and the public API).

:mod:`memdiag.policy` decides from sizes; this module reads the sizes off an ``IndexedSlices``
gradient, keeps each tensor's decision (made once, at the first step), and converts.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import tensorflow as tf

from memdiag.formula import SparseGradientShape
from memdiag.policy import Decision, decide


class DensifyPolicy:
    def __init__(
        self,
        mode: str,
        margin: float,
        world_size: Callable[[], int],
        on_decision: Callable[[Decision], None] | None = None,
        fault: str | None = None,
    ) -> None:
        self.mode = mode
        self.margin = margin
        self.world_size = world_size
        self.on_decision = on_decision
        self.fault = fault
        self.decisions: dict[str, Decision] = {}

    def decide(self, name: str, grad: tf.IndexedSlices, var: Any = None) -> Decision:
        """The decision for ``name``, made the first time it is seen and kept."""
        if name not in self.decisions:
            decision = decide(self.mode, name, self.world_size(), sparse_shape(grad, var), self.margin)
            self.decisions[name] = decision
            if self.on_decision is not None:
                self.on_decision(decision)
        return self.decisions[name]

    def densify(self, grad: tf.IndexedSlices) -> tf.Tensor:
        dense = tf.convert_to_tensor(grad)
        if self.fault == "sum-densified":
            # Deliberately wrong (tests of the verification): the average becomes a sum.
            dense = dense * tf.cast(self.world_size(), dense.dtype)
        return dense

    def apply(self, grads: list[Any], variables: list[Any] | None) -> list[Any]:
        """Gradients with every IndexedSlices the policy densifies converted to a dense tensor."""
        out = list(grads)
        for i, grad in enumerate(out):
            if isinstance(grad, tf.IndexedSlices):
                var = variables[i] if variables is not None else None
                name = getattr(var, "name", None) or f"grad_{i}"
                if self.decide(name, grad, var).densify:
                    out[i] = self.densify(grad)
        return out


def sparse_shape(grad: tf.IndexedSlices, var: Any) -> SparseGradientShape | None:
    """Sizes the formula needs, from static shapes (or concrete ones in eager code)."""
    values_shape = grad.values.shape
    rows = values_shape[0] if values_shape.rank else None
    row_elements = math.prod(values_shape[1:]) if values_shape.rank and values_shape[1:].is_fully_defined() else None
    dense_rows = None
    if grad.dense_shape is not None:
        static = tf.get_static_value(grad.dense_shape)
        if static is not None:
            dense_rows = int(static[0])
    if dense_rows is None and var is not None and var.shape.rank:
        dense_rows = var.shape[0]
    if rows is None or row_elements is None or dense_rows is None:
        return None
    return SparseGradientShape(
        rows_per_rank=int(rows),
        row_bytes=int(row_elements) * tf.as_dtype(grad.values.dtype).size,
        index_bytes=tf.as_dtype(grad.indices.dtype).size,
        dense_rows=int(dense_rows),
        row_elements=int(row_elements),
    )
