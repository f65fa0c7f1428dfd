"""memdiag's per-tensor densify policy as drop-ins for Horovod's gradient reduction.

    import memdiag.tensorflow as mdt
    tape = mdt.DistributedGradientTape(tape, mode="auto")          # for hvd.DistributedGradientTape
    opt = mdt.DistributedOptimizer(keras_optimizer, mode="auto")    # for hvd.DistributedOptimizer

Horovod's ``sparse_as_dense`` converts every IndexedSlices gradient or none; these convert each one
whose allgather would receive more bytes than its dense allreduce (``mode="auto"``). Other keyword
arguments go to Horovod unchanged. ``.memdiag_policy.decisions`` tells what was chosen and why.

A process keeps one policy per (mode, margin, process set): a tape made anew every step (the usual
eager loop) reuses the decisions of the first, and ``auto`` agrees on each decision across the ranks
(the largest row count of any rank) so every rank issues the same collective.
"""

from __future__ import annotations

from typing import Any

from memdiag.densify import DensifyPolicy

__all__ = ["DistributedGradientTape", "DistributedOptimizer"]


_POLICIES: dict[tuple[str, float, Any], DensifyPolicy] = {}


def _policy(mode: str, margin: float, process_set: Any) -> DensifyPolicy:
    key = (mode, margin, getattr(process_set, "process_set_id", None))
    if key not in _POLICIES:
        _POLICIES[key] = DensifyPolicy(mode, margin, process_set.size)
    return _POLICIES[key]


def _with_policy(reducer: Any, policy: DensifyPolicy, process_set: Any) -> Any:
    def allreduce_grads(grads, vars=None, *args, **kwargs):
        return reducer(policy.apply(list(grads), vars, process_set), vars, *args, **kwargs)

    return allreduce_grads


def DistributedGradientTape(gradtape: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """``hvd.DistributedGradientTape`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow as hvd

    kwargs.pop("sparse_as_dense", None)  # the policy decides, per tensor
    process_set = kwargs.get("process_set", hvd.global_process_set)
    tape = hvd.DistributedGradientTape(gradtape, sparse_as_dense=False, **kwargs)
    tape.memdiag_policy = _policy(mode, margin, process_set)
    tape._allreduce_grads = _with_policy(tape._allreduce_grads, tape.memdiag_policy, process_set)
    return tape


def DistributedOptimizer(optimizer: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """Keras ``hvd.DistributedOptimizer`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow.keras as hvd

    kwargs.pop("sparse_as_dense", None)
    process_set = kwargs.get("process_set", hvd.global_process_set)
    wrapped = hvd.DistributedOptimizer(optimizer, sparse_as_dense=False, **kwargs)
    wrapped.memdiag_policy = _policy(mode, margin, process_set)
    wrapped._allreduce_grads = _with_policy(wrapped._allreduce_grads, wrapped.memdiag_policy, process_set)
    return wrapped
