"""The densify policy applied to each IndexedSlices gradient before Horovod sees it, and the records of what it did.

In the default mode (``as-written``) nothing the job does is changed: a script's ``sparse_as_dense=True``
is carried out here, by the same ``tf.convert_to_tensor`` Horovod would apply, so that each tensor can
be labelled. Where memdiag cannot apply its mode to a gradient, the gradient goes to Horovod as the
script asked, and a record says so; the job goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import tensorflow as tf

from memdiag.agent.failures import Failures
from memdiag.agent.naming import Labels, Origin
from memdiag.agreement import AgreementError
from memdiag.densify import DensifyPolicy, distinct_rows, process_set_size
from memdiag.format.records import DistinctRowsRecord, FirstGradientRecord, NotAppliedRecord
from memdiag.graphcalls import host_call


class PolicyApplication:
    """The policy's decisions carried out on the gradients, and what they cost recorded."""

    def __init__(self, policy: DensifyPolicy, tracer: Any, labels: Labels, world_size: Callable[[], int],
                 failures: Failures) -> None:
        self.policy = policy
        self.tracer = tracer
        self.labels = labels
        self.world_size = world_size
        self.failures = failures  # memdiag's own, shared with the hooks: counted, never raised
        self._fingerprinted: set[str] = set()  # the gradients whose first_gradient record is written

    def apply(self, name: str, grad: tf.IndexedSlices, var: Any, script_densifies: bool, process_set: Any,
              reduce_op: str | None = None, count: bool = True) -> tuple[Any, bool, bool]:
        """The gradient as the policy reduces it, and whether it was densified and merged. Where memdiag
        cannot apply the mode to this gradient, the gradient goes to Horovod as the script asked (its
        ``sparse_as_dense``, which memdiag took over) and a ``not_applied`` record names it and why, so that
        the report never claims a change the records do not show; the job goes on."""
        try:
            decision = self.policy.decide(name, grad, var, script_densifies, process_set, reduce_op)
            if decision.merge:
                return self.merge(name, grad), False, True
            if count and self.policy.mode != "as-written":  # as written, nothing is added to the job
                self.record_distinct(name, grad)
            return (self.policy.densify(grad) if decision.densify else grad), decision.densify, False
        except AgreementError:
            raise  # the ranks cannot issue the same collectives: the job must not go on
        except Exception as exc:  # noqa: BLE001 - a decision never fails the job
            self.not_applied(name, exc)
            return (tf.convert_to_tensor(grad) if script_densifies else grad), script_densifies, False

    def not_applied(self, name: str, exc: BaseException) -> None:
        """memdiag could not apply its mode to the gradient ``name``: counted, and recorded once per name."""
        if self.policy.mode == "as-written":
            self.failures.failed(f"label {name}", exc)
            return
        if self.failures.first(f"apply --mode {self.policy.mode} to {name}"):
            with contextlib.suppress(Exception):
                self.tracer.writer.add(NotAppliedRecord(type="not_applied", step=self.tracer.step, name=name,
                                                        mode=self.policy.mode,
                                                        error=f"{type(exc).__name__}: {exc}"[:400]))

    def reduce_at_run_time(self, origin: Origin, grad: tf.IndexedSlices, var: Any, script_densifies: bool,
                           kwargs: dict[str, Any]) -> Any:
        """``auto`` decided when the first step runs (:meth:`DensifyPolicy.reduce_at_run_time`), each
        branch's collective labelled for the op-level records."""
        name, process_set = origin.name, kwargs.get("process_set")
        world = process_set_size(process_set) or self.world_size()
        labels = {"sparse": origin, "dedup": replace(origin, merged=True), "dense": replace(origin, densified=True)}

        def allreduce(tensor: Any, reduction: str) -> Any:
            with self.labels.queued([labels[reduction]]):
                return sys.modules["horovod.tensorflow"].allreduce(tensor, **kwargs)

        return self.policy.reduce_at_run_time(name, grad, var, script_densifies, world, process_set, allreduce,
                                              merge=lambda g: self.merge(name, g),
                                              count=lambda g: self.record_distinct(name, g))

    def merge(self, name: str, grad: tf.IndexedSlices) -> tf.IndexedSlices:
        """The gradient with its duplicate rows summed, and a ``distinct_rows`` record of T, U and the
        time the merge took (unique + segment sum, from its inputs being ready to its outputs)."""
        if tf.executing_eagerly():
            start = time.perf_counter()
            merged = self.policy.merge(grad)
            _ = merged.values.numpy()
            self._emit_distinct(name, int(grad.indices.shape[0]), int(merged.indices.shape[0]),
                                time.perf_counter() - start)
            return merged
        with tf.control_dependencies([grad.values, grad.indices]):
            start = host_call(_now, [], Tout=tf.float64, name="memdiag_merge_start")
        with tf.control_dependencies([start]):
            merged = self.policy.merge(grad)
        with tf.control_dependencies([merged.values, merged.indices]):
            end = host_call(_now, [], Tout=tf.float64, name="memdiag_merge_end")
        rows = tf.shape(grad.indices, out_type=tf.int64)[0]
        distinct = tf.shape(merged.indices, out_type=tf.int64)[0]

        def emit(t: Any, u: Any, t0: Any, t1: Any) -> list[Any]:
            self.failures.guard("record distinct rows", lambda: self._emit_distinct(name, int(t), int(u), float(t1) - float(t0)))
            return []

        with tf.control_dependencies([end]):
            host_call(emit, [rows, distinct, start, end], name="memdiag_distinct_rows")
        return merged

    def record_distinct(self, name: str, grad: tf.IndexedSlices) -> None:
        """A ``distinct_rows`` record of T and U for a gradient that is not merged (U counted only)."""
        if tf.executing_eagerly():
            self._emit_distinct(name, int(grad.indices.shape[0]), int(distinct_rows(grad.indices)), None)
            return

        def emit(t: Any, u: Any) -> list[Any]:
            self.failures.guard("record distinct rows", lambda: self._emit_distinct(name, int(t), int(u), None))
            return []

        host_call(emit, [tf.shape(grad.indices, out_type=tf.int64)[0], distinct_rows(grad.indices)],
                  name="memdiag_distinct_rows")

    def fingerprint(self, name: str, grad: tf.IndexedSlices) -> None:
        """A ``first_gradient`` record of this rank's gradient ``name`` the first time it is reduced, before
        any mode changes it: digests of its row indices and of its values. What a mode does to the
        reduction cannot change them; the script's data, sampling and initial parameters do."""
        def emit(indices: Any, values: Any) -> list[Any]:
            if name not in self._fingerprinted:
                self._fingerprinted.add(name)
                self.failures.guard("fingerprint a gradient", lambda: self.tracer.writer.add(FirstGradientRecord(
                    type="first_gradient", step=self.tracer.step, name=name, rows=int(len(indices)),
                    indices_digest=_digest(indices), values_digest=_digest(values))))
            return []

        if tf.executing_eagerly():
            if name not in self._fingerprinted:
                emit(grad.indices.numpy(), grad.values.numpy())
            return
        host_call(emit, [grad.indices, grad.values], name="memdiag_first_gradient")

    def _emit_distinct(self, name: str, rows: int, distinct: int, merge_s: float | None) -> None:
        self.tracer.writer.add(DistinctRowsRecord(type="distinct_rows", step=self.tracer.step, name=name, rows=rows,
                                                  distinct_rows=distinct, merge_s=merge_s))


def reducible(arguments: dict[str, Any]) -> bool:
    """Whether Horovod reduces an IndexedSlices with these arguments at all (Sum or Average; no
    pre/postscale): otherwise it raises, and memdiag leaves the call to it unchanged."""
    import horovod.tensorflow as hvd

    op = arguments.get("op")
    average = arguments.get("average")
    if op is None:
        op = hvd.Average if average in (None, True) else hvd.Sum
    return int(op) in (int(hvd.Sum), int(hvd.Average)) and \
        arguments.get("prescale_factor", 1.0) == 1.0 and arguments.get("postscale_factor", 1.0) == 1.0


def _digest(array: Any) -> str:
    """An exact fingerprint of an array's dtype, shape and bytes."""
    value = np.ascontiguousarray(array)
    h = hashlib.blake2b(f"{value.dtype.str}{value.shape}".encode(), digest_size=12)
    h.update(value.tobytes())
    return h.hexdigest()


def _now() -> np.float64:
    return np.float64(time.perf_counter())
