"""memdiag's per-tensor densify policy as drop-ins for Horovod's gradient reduction.

    import memdiag.tensorflow as mdt
    tape = mdt.DistributedGradientTape(tape, mode="auto")          # for hvd.DistributedGradientTape
    opt = mdt.DistributedOptimizer(keras_optimizer, mode="auto")    # for hvd.DistributedOptimizer

Horovod's ``sparse_as_dense`` converts every IndexedSlices gradient or none; these convert each one
whose allgather would receive more bytes than its dense allreduce (``mode="auto"``). Other keyword
arguments go to Horovod unchanged. ``.memdiag_policy.decisions`` tells what was chosen and why.
"""

from __future__ import annotations

from typing import Any

from memdiag.densify import DensifyPolicy

__all__ = ["DistributedGradientTape", "DistributedOptimizer"]


def _with_policy(reducer: Any, policy: DensifyPolicy) -> Any:
    def allreduce_grads(grads, vars=None, *args, **kwargs):
        return reducer(policy.apply(list(grads), vars), vars, *args, **kwargs)

    return allreduce_grads


def DistributedGradientTape(gradtape: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """``hvd.DistributedGradientTape`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow as hvd

    process_set = kwargs.get("process_set", hvd.global_process_set)
    tape = hvd.DistributedGradientTape(gradtape, sparse_as_dense=False, **kwargs)
    tape.memdiag_policy = DensifyPolicy(mode, margin, process_set.size)
    tape._allreduce_grads = _with_policy(tape._allreduce_grads, tape.memdiag_policy)
    return tape


def DistributedOptimizer(optimizer: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """Keras ``hvd.DistributedOptimizer`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow.keras as hvd

    process_set = kwargs.get("process_set", hvd.global_process_set)
    wrapped = hvd.DistributedOptimizer(optimizer, sparse_as_dense=False, **kwargs)
    wrapped.memdiag_policy = DensifyPolicy(mode, margin, process_set.size)
    wrapped._allreduce_grads = _with_policy(wrapped._allreduce_grads, wrapped.memdiag_policy)
    return wrapped
