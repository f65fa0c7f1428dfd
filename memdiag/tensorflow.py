"""memdiag's per-tensor reduction policy as drop-ins for Horovod's gradient reduction.

    import memdiag.tensorflow as mdt
    tape = mdt.DistributedGradientTape(tape, mode="auto")          # for hvd.DistributedGradientTape
    opt = mdt.DistributedOptimizer(keras_optimizer, mode="auto")    # for hvd.DistributedOptimizer

Horovod's ``sparse_as_dense`` converts every IndexedSlices gradient or none; ``mode="auto"`` reduces
each one the cheapest of three ways in received bytes: Horovod's allgather, the duplicate rows summed
first and the distinct rows gathered (``mode="dedup"`` does this for all), or a dense allreduce
(``mode="dense"``). Inside a ``tf.function`` the distinct rows are measured, and agreed across the
ranks, when the first step runs; in eager code when the tape is first used. Other keyword arguments
go to Horovod unchanged. ``.memdiag_policy.decisions`` tells what was chosen and why.

A process keeps one policy per (mode, margin, process set): a tape made anew every step (the usual
eager loop) reuses the decisions of the first, and ``auto`` agrees on each decision across the ranks
(the largest row count of any rank) so every rank issues the same collective.
"""

from __future__ import annotations

from typing import Any

from memdiag.densify import DensifyPolicy
from memdiag.policy import MODES

__all__ = ["DistributedGradientTape", "DistributedOptimizer"]


_POLICIES: dict[tuple[str, float, Any], DensifyPolicy] = {}


def _policy(mode: str, margin: float, process_set: Any) -> DensifyPolicy:
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: choose one of {', '.join(MODES)}")
    key = (mode, margin, getattr(process_set, "process_set_id", None))
    if key not in _POLICIES:
        _POLICIES[key] = DensifyPolicy(mode, margin, process_set.size)
    return _POLICIES[key]


def _with_policy(reducer: Any, policy: DensifyPolicy, process_set: Any, kwargs: dict[str, Any]) -> Any:
    """The reducer with IndexedSlices gradients converted first; those ``auto`` decides only when the
    step runs (in a graph) are reduced apart, each by its chosen branch, with Horovod's allreduce and
    the same op, compression and process set."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    op = kwargs.get("op")
    options = {k: kwargs[k] for k in ("op", "compression", "process_set") if kwargs.get(k) is not None}

    def allreduce_grads(grads, vars=None, *args, **kw):
        grads = list(grads)
        later = {}
        if op in (None, hvd.Average, hvd.Sum):  # Horovod reduces IndexedSlices with these only
            for i, grad in enumerate(grads):
                var = vars[i] if vars is not None else None
                if isinstance(grad, tf.IndexedSlices) and policy.needs_run_time(grad, var, process_set):
                    later[i], grads[i] = grad, None
        reduced = reducer(policy.apply(grads, vars, process_set), vars, *args, **kw)
        if not later:
            return reduced
        reduced = list(reduced)
        for i, grad in later.items():
            var = vars[i] if vars is not None else None
            name = getattr(var, "name", None) or f"grad_{i}"
            reduced[i] = policy.reduce_at_run_time(
                name, grad, var, False, _size(process_set), process_set,
                lambda tensor, reduction: hvd.allreduce(tensor, **options))
        return reduced

    return allreduce_grads


def _size(process_set: Any) -> int:
    size = process_set.size
    return int(size() if callable(size) else size)


def DistributedGradientTape(gradtape: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """``hvd.DistributedGradientTape`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow as hvd

    kwargs.pop("sparse_as_dense", None)  # the policy decides, per tensor
    process_set = kwargs.get("process_set", hvd.global_process_set)
    tape = hvd.DistributedGradientTape(gradtape, sparse_as_dense=False, **kwargs)
    tape.memdiag_policy = _policy(mode, margin, process_set)
    tape._allreduce_grads = _with_policy(tape._allreduce_grads, tape.memdiag_policy, process_set, kwargs)
    return tape


def DistributedOptimizer(optimizer: Any, mode: str = "auto", margin: float = 1.0, **kwargs: Any) -> Any:
    """Keras ``hvd.DistributedOptimizer`` whose IndexedSlices gradients follow memdiag's policy."""
    import horovod.tensorflow.keras as hvd

    kwargs.pop("sparse_as_dense", None)
    process_set = kwargs.get("process_set", hvd.global_process_set)
    wrapped = hvd.DistributedOptimizer(optimizer, sparse_as_dense=False, **kwargs)
    wrapped.memdiag_policy = _policy(mode, margin, process_set)
    wrapped._allreduce_grads = _with_policy(wrapped._allreduce_grads, wrapped.memdiag_policy, process_set, kwargs)
    return wrapped
