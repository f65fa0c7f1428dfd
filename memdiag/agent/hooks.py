"""Hooks on Horovod's TensorFlow collectives: where collective records come from.

Horovod's public functions are replaced, in every loaded ``horovod`` module that holds them (so that a
module which imported one by name, like ``sync_batch_norm``'s ``_allreduce``, is covered too), by
wrappers that (1) apply the densify policy to IndexedSlices gradients before Horovod sees them and
(2) record every collective that reaches Horovod's ops with its runtime shapes.

Three levels are wrapped. The constructors (``DistributedGradientTape``, ``DistributedOptimizer``, also
Keras') record the script's own choices (``sparse_as_dense``, ``op``, compression, process set, groups,
``backward_passes_per_step``). The gradient level (``_make_allreduce_grads_fn``, ``allreduce``,
``grouped_allreduce``) knows variable names and IndexedSlices; it decides and labels. The op level
(``_allreduce``, ``allgather``, ``broadcast``, ``alltoall`` ...) is where bytes move; it records.

In the default mode (``as-written``) nothing the job does is changed: a script's ``sparse_as_dense=True``
is carried out here, by the same ``tf.convert_to_tensor`` Horovod would apply, so that each tensor can
be labelled. Labels flow from the gradient level to the op level in the order Horovod issues the
reductions (which ``groups=`` changes; :func:`reduction_order` follows Horovod's own rule).

Inside ``tf.function`` (and Horovod runs its gradient reduction in one even in eager code) shapes are
only known at run time, so the record is written by a ``tf.py_function`` that takes the runtime
shapes of the op's input and output: it runs after the collective, on every step.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import inspect
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph

from memdiag import graphcalls, optimizer_input
from memdiag.agent import parameters, replay
from memdiag.agent.parameters import ParameterCapture
from memdiag.agreement import AgreementError
from memdiag.compat import paired
from memdiag.densify import DensifyPolicy, distinct_rows, process_set_size
from memdiag.graphcalls import host_call
from memdiag.policy import Decision, horovod_op_names
from memdiag.rounding import gamma

# Frames under these folders are not a user's call site: installed packages, the standard library, memdiag.
_LIBRARY_DIRS = tuple(sorted({os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
                              os.path.dirname(os.__file__) + os.sep}))


@dataclass
class Origin:
    """What a collective's tensor is, as known at the gradient level."""

    name: str
    sparse: bool = False
    densified: bool = False
    merged: bool = False  # duplicate rows summed before the allgather (dedup)
    gradient: bool = False  # a gradient reduction: the anchor of a script's steps
    reduce_op: str | None = None  # average, sum, adasum, min, max, product
    process_set_size: int | None = None  # ranks taking part; None: all


def rounding_bound_ratio(diff: Any, reference: Any, terms: Any, magnitude: Any, unit: float) -> float:
    """The largest |a - b| of two reductions of the same rows as a fraction of float rounding's bound.

    Summing n terms in any order is off the exact sum by at most gamma(n - 1) x the sum of their
    magnitudes, gamma(k) = k u / (1 - k u), u the unit roundoff (2**-24 for float32); dividing each term
    first (Horovod's sparse average) rounds each once more, so gamma(n) bounds either path. Two orders
    differ by at most twice that, and a final scaling (the dense average) rounds once more (2 u |a|).
    ``terms`` is per row, ``magnitude`` per element. 1 or less: the two agree as closely as float
    arithmetic lets any two summation orders agree."""
    n = np.asarray(terms, dtype=np.float64).reshape((-1,) + (1,) * (diff.ndim - 1))
    bound = 2 * gamma(n, unit) * magnitude + 2 * unit * abs(reference)
    over = np.where(bound > 0, diff / np.where(bound > 0, bound, 1), np.where(diff > 0, np.inf, 0.0))
    return float(over.max(initial=0.0))


class CollectiveHooks:
    def __init__(
        self,
        tracer: Any,
        mode: str,
        margin: float,
        world_size: Callable[[], int],
        on_decision: Callable[[Decision], None],
        fault: str | None = None,
        check_reduction: bool = False,
        initial_parameters: str | None = None,
        fingerprint_gradients: bool = False,
    ) -> None:
        self.tracer = tracer
        self.initial_parameters = initial_parameters  # where to save the parameters before the first update
        self.world_size = world_size
        self.policy = DensifyPolicy(mode, margin, world_size, on_decision, fault)
        self.check_reduction = check_reduction
        self.fingerprint_gradients = fingerprint_gradients
        self._fingerprinted: set[str] = set()  # the gradients whose first_gradient record is written
        # the trainable variables the gradient hooks saw, by name; read where they can be read
        self.variables = ParameterCapture(self._failed)
        self._plain_allreduce: Callable | None = None
        self._local = threading.local()
        self._originals: list[tuple[Any, str, Any]] = []
        self._choices_seen: set[str] = set()
        self._initial_recorded = False
        self.on_init: Callable[[], None] | None = None  # called once, when the script calls hvd.init()
        self._ops: dict[int, str] = {}
        # memdiag's own failures inside a hook, by what failed: counted and reported, never raised
        self.failures: collections.Counter[str] = collections.Counter()
        self._lock: Any = threading.Lock()
        # per graph being built: how many unnamed collectives of each call site and shape it holds
        self._occurrences: weakref.WeakKeyDictionary[Any, collections.Counter[str]] = weakref.WeakKeyDictionary()
        # Native marks (memdiag.nativemarks), when the rank uses them: what each mark's key stands for
        # (BEGIN: op, meta, world size; END: op, meta), and the drain's guard against re-entry.
        self.native: Any = None
        self._marked: list[replay.Marked] = []
        self._keys: replay.KeysFile | None = None
        self._drain_lock = threading.Lock()
        self._draining = threading.local()
        self.record_every_s = 0.0  # --record-every: the sampler thread drains at most this often (drain_when_due)
        self._last_drain = time.monotonic()

    def use_native(self, marks: Any, record_every_s: float = 0.0, keys: replay.KeysFile | None = None) -> None:
        """Mark collectives inside graphs with the native op of ``marks``; the tracer and the sampler
        drain its records (:meth:`drain`), the sampler every ``record_every_s`` (:meth:`drain_when_due`).
        ``keys``: where each mark's key is written as it is made, for a replay of the marks' file
        (memdiag.agent.replay)."""
        self.native = marks
        self.record_every_s = record_every_s
        self._keys = keys
        self.tracer.drain = self.drain
        self.tracer.sampler.before_sample = self.drain_when_due

    def drain_when_due(self) -> None:
        """The sampler thread's drain: at every wake (``record_every_s`` 0, the default), else once that
        long has passed since the last drain, or earlier when the ring is half full. Drained at every
        wake, each step's marks become records within a wake of its end, so a rank killed outright
        loses only the step it was in; but a drain of one step's marks costs several times what the
        same work costs in a batch of many steps (its code and data are no longer in the CPU's caches
        when the job has run in between: probes/drain_cost.py --cold), which is most of memdiag's CPU
        per step for a script with short steps (docs/notes/performance.md). The tracer's own entry
        points (a built-in workload's steps, eager calls, the end of the run) drain whatever waits."""
        if self.record_every_s and time.monotonic() - self._last_drain < self.record_every_s \
                and self.native is not None and self.native.pending() < self.native.capacity // 2:
            return
        self.drain()

    def drain(self) -> None:
        """Hand the tracer the native marks written since the last drain, in the order of their times,
        each with its time. Called by the sampler thread and by the tracer's entry points; a drain
        that ends a step calls back into the tracer, which must not drain again (the guard)."""
        if self.native is None or getattr(self._draining, "on", False):
            return
        self._draining.on = True
        try:
            with self._drain_lock:
                self._last_drain = time.monotonic()
                lost = self.native.lost
                records = self.native.read()
                if self.native.lost > lost:  # the ring wrapped before it was read: a warning in the report
                    self._failed("read every native mark", RuntimeError(
                        f"{self.native.lost - lost} overwritten before they were read (the drain fell behind)"))
                # the native timer's samples up to now (--record-every), so that every sample before the
                # marks' times is in the series when a mark ends a step
                self.tracer.sampler.pull_timer()
                if len(records):
                    self._guard("read the native marks", lambda: self._dispatch(records))
        finally:
            self._draining.on = False

    def _dispatch(self, records: Any) -> None:
        replay.dispatch(self.tracer, self._marked, records)

    # -- installation -------------------------------------------------------------------------
    def install(self) -> None:
        import horovod.tensorflow as hvd
        import horovod.tensorflow.mpi_ops as mpi_ops

        self._ops = horovod_op_names(hvd)
        tables: dict[str, dict[str, Callable[[Callable], Callable]]] = {
            "constructors": {"DistributedGradientTape": self._wrap_constructor("DistributedGradientTape"),
                             "DistributedOptimizer": self._wrap_constructor("DistributedOptimizer")},
            "gradient": {"_make_allreduce_grads_fn": self._wrap_make_allreduce_grads_fn,
                         "allreduce": self._wrap_allreduce,
                         "grouped_allreduce": self._wrap_grouped_allreduce},
            "op": {"init": self._wrap_init,
                   "_allreduce": self._wrap_op("allreduce"),
                   "_grouped_allreduce": self._wrap_grouped_op("allreduce"),
                   "allgather": self._wrap_op("allgather"),
                   "grouped_allgather": self._wrap_grouped_op("allgather"),
                   "broadcast": self._wrap_op("broadcast"),
                   "broadcast_": self._wrap_inplace_broadcast,
                   "alltoall": self._wrap_op("alltoall"),
                   "_reducescatter": self._wrap_op("reducescatter"),
                   "_grouped_reducescatter": self._wrap_grouped_op("reducescatter")},
        }
        self._plain_allreduce = hvd.allreduce
        self._originals += graphcalls.install()  # memdiag's records order nothing in the job's graph
        _import_keras_frontend()
        # The functions are defined in these modules; anything else that holds one got it by import.
        homes = {"constructors": ("horovod.tensorflow", "horovod.tensorflow.keras"),
                 "gradient": ("horovod.tensorflow",), "op": (mpi_ops.__name__,)}
        wrapped_of: dict[int, Any] = {}
        for level, table in tables.items():
            for home in homes[level]:
                module = sys.modules.get(home)
                for attr, wrap in table.items():
                    original = getattr(module, attr, None) if module is not None else None
                    if original is None or id(original) in wrapped_of or getattr(original, "__memdiag__", False):
                        continue
                    wrapped: Any = as_called(wrap, original)
                    wrapped.__memdiag__ = True
                    wrapped.__wrapped__ = original
                    wrapped_of[id(original)] = (original, wrapped)
        for name, module in list(sys.modules.items()):
            if not (name == "horovod" or name.startswith("horovod.")) or module is None:
                continue
            for attr, value in list(vars(module).items()):
                if id(value) in wrapped_of and wrapped_of[id(value)][0] is value:
                    self._originals.append((module, attr, value))
                    setattr(module, attr, wrapped_of[id(value)][1])

    # -- memdiag's own failures -------------------------------------------------------------------
    def _failed(self, what: str, exc: BaseException) -> None:
        """memdiag could not do ``what`` (label, record, read a variable): counted, and the first time
        recorded with its error, so that the report names it. The job goes on as if unhooked."""
        with self._lock:
            self.failures[what] += 1
            first = self.failures[what] == 1
        if first:
            with contextlib.suppress(Exception):
                self.tracer.writer.add({"type": "bookkeeping", "step": self.tracer.step, "what": what,
                                        "error": f"{type(exc).__name__}: {exc}"[:400]})

    def _guard(self, what: str, action: Callable[[], Any]) -> Any:
        """``action()``, or None where it fails (the failure counted)."""
        try:
            return action()
        except Exception as exc:  # noqa: BLE001 - recording never raises into the user's code
            self._failed(what, exc)
            return None

    def failure_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.failures)

    def _wrap_init(self, original: Callable) -> Callable:
        def init(*args, **kwargs):
            result = original(*args, **kwargs)
            callback, self.on_init = self.on_init, None
            if callback is not None:
                callback()
            return result

        return init

    # -- the script's choices -----------------------------------------------------------------------
    def _wrap_constructor(self, api: str) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            signature = _signature(original)
            frontend = "keras" if "keras" in (original.__module__ or "") else "tensorflow"

            def constructor(*args, **kwargs):
                def record() -> None:
                    arguments = _bind(signature, args, kwargs)
                    choices = {k: self._describe(k, v) for k, v in arguments.items()
                               if k not in ("gradtape", "optimizer", "name", "device_dense", "device_sparse")}
                    self._record_choices({"api": f"{frontend}.{api}", **choices})

                self._guard(f"record the choices of {api}", record)
                return original(*args, **kwargs)

            return constructor

        return wrap

    def _record_choices(self, choices: dict[str, Any]) -> None:
        key = repr(sorted(choices.items()))
        if key in self._choices_seen:
            return
        self._choices_seen.add(key)
        self.tracer.writer.add({"type": "choices", "step": self.tracer.step, **choices})

    def _describe(self, key: str, value: Any) -> Any:
        """A JSON value for one of the script's arguments to Horovod."""
        if key == "op":
            return self._op_name(value)
        if key == "compression":
            return getattr(value, "__name__", type(value).__name__)
        if key == "process_set":
            return _describe_process_set(value)
        if key in ("groups", "num_groups") and isinstance(value, (list, tuple)):
            return [[_var_name(v) for v in group] for group in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return repr(value)

    def _op_name(self, op: Any) -> str:
        if op is None:
            return "average"  # Horovod's default
        return self._ops.get(int(op), str(op))

    # -- gradient level -------------------------------------------------------------------------
    def _wrap_make_allreduce_grads_fn(self, original: Callable) -> Callable:
        signature = _signature(original)

        def make(*args, **kwargs):
            try:
                arguments = _bind(signature, args, kwargs)
                script_densifies = bool(arguments.get("sparse_as_dense"))
                # memdiag converts (as Horovod would have) so that it can label, and decide, per tensor.
                inner = original(*_rebind(signature, arguments, sparse_as_dense=False))
            except Exception as exc:  # noqa: BLE001 - Horovod's own call decides what the script gets
                self._failed("hook the gradient reduction", exc)
                return original(*args, **kwargs)
            op, compression = arguments.get("op"), arguments.get("compression")
            process_set, groups = arguments.get("process_set"), arguments.get("groups")
            self._record_choices({"api": "gradient reduction", "sparse_as_dense": script_densifies,
                                  "op": self._op_name(op), "compression": self._describe("compression", compression),
                                  "process_set": _describe_process_set(process_set),
                                  "groups": self._describe("groups", groups),
                                  "gradient_predivide_factor": arguments.get("gradient_predivide_factor")})
            reduce_op = self._op_name(op)
            set_size = process_set_size(process_set)

            reduce_inner: Callable[..., Any] = inner  # Horovod's reduction, as autograph runs it where called

            def allreduce_grads(grads, vars=None, use_generic_names=False):
                try:
                    prepared = prepare(grads, vars)
                except AgreementError:
                    raise  # the ranks cannot issue the same collectives: the job must not go on
                except Exception as exc:  # noqa: BLE001 - the reduction Horovod itself would have made
                    self._failed("label the gradients", exc)
                    return original(*args, **kwargs)(grads, vars, use_generic_names)
                grads, origins, at_run_time = prepared
                order = reduction_order(grads, vars, groups)
                with self._queued([origins[i] for i in order]):
                    reduced = reduce_inner(grads, vars, use_generic_names)
                if not at_run_time:
                    return reduced
                reduced = list(reduced)
                for i, (grad, var) in at_run_time.items():
                    reduced[i] = self._reduce_at_run_time(origins[i], grad, var, script_densifies,
                                                          {"op": op, "compression": compression,
                                                           "process_set": process_set})
                return reduced

            def prepare(grads: Any, vars: Any) -> tuple[list[Any], dict[int, Origin], dict[int, tuple[Any, Any]]]:
                """The gradients as memdiag hands them to Horovod, their labels, and those ``auto``
                reduces at run time."""
                grads = list(grads)
                origins: dict[int, Origin] = {}
                at_run_time: dict[int, tuple[tf.IndexedSlices, Any]] = {}
                variables = list(vars) if vars is not None else [None] * len(grads)
                items = [(_var_name(var) if var is not None else f"grad_{i}", grad, var)
                         for i, (grad, var) in enumerate(paired(grads, variables))]
                if self.policy.mode == "auto":
                    # New tensors agreed in the order of their names, whatever order a rank lists them in.
                    self.policy.decide_in_name_order(items, script_densifies, process_set,
                                                     run_time_ok=reduce_op in ("average", "sum"), reduce_op=reduce_op)
                for i, (name, grad, var) in enumerate(items):
                    if grad is None:
                        continue
                    self._capture(name, var)
                    origin = Origin(name, gradient=True, reduce_op=reduce_op, process_set_size=set_size)
                    if isinstance(grad, tf.IndexedSlices):
                        with graphcalls.collected() as made:
                            if self.fingerprint_gradients:
                                self._fingerprint(name, grad)
                            if self.check_reduction:
                                self._compare_reductions(name, grad, op, compression, process_set)
                            run_time = (reduce_op in ("average", "sum")
                                        and self.policy.needs_run_time(grad, var, process_set, name))
                            if not run_time:
                                grads[i], densified, merged = self._apply_policy(name, grad, var, script_densifies,
                                                                                 process_set, reduce_op)
                        # In a TF1 graph the records made here run only if what the script fetches waits for them.
                        waiting = graphcalls.unreached(made)
                        if run_time:
                            # Reduced below, by the path the first step's agreed rows choose.
                            at_run_time[i] = (_after(grad, waiting), var)
                            grads[i] = None
                            origins[i] = replace(origin, sparse=True)
                            continue
                        grads[i] = _after(grads[i], waiting)
                        origin = replace(origin, sparse=True, densified=densified, merged=merged)
                    origins[i] = origin
                if not self._initial_recorded and self.variables:
                    self._initial_recorded = True
                    self._guard("read the initial parameters", self._record_initial)
                return grads, origins, at_run_time

            def with_inner(inner_as_called: Callable[..., Any]) -> Callable[..., Any]:
                nonlocal reduce_inner
                reduce_inner = inner_as_called
                return allreduce_grads

            return as_called(with_inner, inner)

        return make

    def _apply_policy(self, name: str, grad: tf.IndexedSlices, var: Any, script_densifies: bool, process_set: Any,
                      reduce_op: str | None = None, count: bool = True) -> tuple[Any, bool, bool]:
        """The gradient as the policy reduces it, and whether it was densified and merged. Where memdiag
        cannot apply the mode to this gradient, the gradient goes to Horovod as the script asked (its
        ``sparse_as_dense``, which memdiag took over) and a ``not_applied`` record names it and why, so that
        the report never claims a change the records do not show; the job goes on."""
        try:
            decision = self.policy.decide(name, grad, var, script_densifies, process_set, reduce_op)
            if decision.merge:
                return self._merge(name, grad), False, True
            if count and self.policy.mode != "as-written":  # as written, nothing is added to the job
                self._record_distinct(name, grad)
            return (self.policy.densify(grad) if decision.densify else grad), decision.densify, False
        except AgreementError:
            raise  # the ranks cannot issue the same collectives: the job must not go on
        except Exception as exc:  # noqa: BLE001 - a decision never fails the job
            self._not_applied(name, exc)
            return (tf.convert_to_tensor(grad) if script_densifies else grad), script_densifies, False

    def _not_applied(self, name: str, exc: BaseException) -> None:
        """memdiag could not apply its mode to the gradient ``name``: counted, and recorded once per name."""
        if self.policy.mode == "as-written":
            self._failed(f"label {name}", exc)
            return
        what = f"apply --mode {self.policy.mode} to {name}"
        with self._lock:
            self.failures[what] += 1
            first = self.failures[what] == 1
        if first:
            with contextlib.suppress(Exception):
                self.tracer.writer.add({"type": "not_applied", "step": self.tracer.step, "name": name,
                                        "mode": self.policy.mode, "error": f"{type(exc).__name__}: {exc}"[:400]})

    def _reduce_at_run_time(self, origin: Origin, grad: tf.IndexedSlices, var: Any, script_densifies: bool,
                            kwargs: dict[str, Any]) -> Any:
        """``auto`` decided when the first step runs (:meth:`DensifyPolicy.reduce_at_run_time`), each
        branch's collective labelled for the op-level records."""
        name, process_set = origin.name, kwargs.get("process_set")
        world = process_set_size(process_set) or self.world_size()
        labels = {"sparse": origin, "dedup": replace(origin, merged=True), "dense": replace(origin, densified=True)}

        def allreduce(tensor: Any, reduction: str) -> Any:
            with self._queued([labels[reduction]]):
                return sys.modules["horovod.tensorflow"].allreduce(tensor, **kwargs)

        return self.policy.reduce_at_run_time(name, grad, var, script_densifies, world, process_set, allreduce,
                                              merge=lambda g: self._merge(name, g),
                                              count=lambda g: self._record_distinct(name, g))

    def _merge(self, name: str, grad: tf.IndexedSlices) -> tf.IndexedSlices:
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

        def emit(t, u, t0, t1):
            self._guard("record distinct rows", lambda: self._emit_distinct(name, int(t), int(u), float(t1) - float(t0)))
            return []

        with tf.control_dependencies([end]):
            host_call(emit, [rows, distinct, start, end], name="memdiag_distinct_rows")
        return merged

    def _record_distinct(self, name: str, grad: tf.IndexedSlices) -> None:
        """A ``distinct_rows`` record of T and U for a gradient that is not merged (U counted only)."""
        if tf.executing_eagerly():
            self._emit_distinct(name, int(grad.indices.shape[0]), int(distinct_rows(grad.indices)), None)
            return

        def emit(t, u):
            self._guard("record distinct rows", lambda: self._emit_distinct(name, int(t), int(u), None))
            return []

        host_call(emit, [tf.shape(grad.indices, out_type=tf.int64)[0], distinct_rows(grad.indices)],
                  name="memdiag_distinct_rows")

    def _fingerprint(self, name: str, grad: tf.IndexedSlices) -> None:
        """A ``first_gradient`` record of this rank's gradient ``name`` the first time it is reduced, before
        any mode changes it: digests of its row indices and of its values. What a mode does to the
        reduction cannot change them; the script's data, sampling and initial parameters do."""
        def emit(indices: Any, values: Any) -> list[Any]:
            if name not in self._fingerprinted:
                self._fingerprinted.add(name)
                self._guard("fingerprint a gradient", lambda: self.tracer.writer.add({
                    "type": "first_gradient", "step": self.tracer.step, "name": name, "rows": int(len(indices)),
                    "indices_digest": _digest(indices), "values_digest": _digest(values)}))
            return []

        if tf.executing_eagerly():
            if name not in self._fingerprinted:
                emit(grad.indices.numpy(), grad.values.numpy())
            return
        host_call(emit, [grad.indices, grad.values], name="memdiag_first_gradient")

    def _emit_distinct(self, name: str, rows: int, distinct: int, merge_s: float | None) -> None:
        self.tracer.writer.add({"type": "distinct_rows", "step": self.tracer.step, "name": name, "rows": rows,
                                "distinct_rows": distinct, "merge_s": merge_s})

    def _wrap_allreduce(self, original: Callable) -> Callable:
        signature = _signature(original)

        def allreduce(tensor, *args, **kwargs):
            given = tensor
            try:
                arguments = _bind(signature, (tensor, *args), kwargs)
                origin = self._take_origin(arguments.get("name"), tensor, arguments)
                if isinstance(tensor, tf.IndexedSlices) and not origin.gradient and _reducible(arguments):
                    # A script's own hvd.allreduce of an IndexedSlices: the policy applies as well.
                    with graphcalls.collected() as made:
                        tensor, densified, merged = self._apply_policy(origin.name, tensor, None, False,
                                                                       arguments.get("process_set"), count=False)
                    tensor = _after(tensor, graphcalls.unreached(made))
                    origin = replace(origin, densified=densified, merged=merged)
                sparse = isinstance(tensor, tf.IndexedSlices)
                context = self._current([] if sparse else [origin], [origin] if sparse else [])
            except AgreementError:
                raise  # the ranks cannot issue the same collectives: the job must not go on
            except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                self._failed("label an allreduce", exc)
                return original(given, *args, **kwargs)
            with context:
                return original(tensor, *args, **kwargs)

        return allreduce

    def _wrap_grouped_allreduce(self, original: Callable) -> Callable:
        signature = _signature(original)

        def grouped_allreduce(tensors, *args, **kwargs):
            given = tensors
            try:
                arguments = _bind(signature, (tensors, *args), kwargs)
                tensors = list(tensors)
                dense: list[Origin] = []
                sparse: list[Origin] = []
                for i, tensor in enumerate(tensors):
                    origin = self._take_origin(None, tensor, arguments)
                    if isinstance(tensor, tf.IndexedSlices) and not origin.gradient and _reducible(arguments):
                        with graphcalls.collected() as made:
                            tensors[i], densified, merged = self._apply_policy(origin.name, tensor, None, False,
                                                                               arguments.get("process_set"),
                                                                               count=False)
                        tensors[i] = _after(tensors[i], graphcalls.unreached(made))
                        origin = replace(origin, densified=densified, merged=merged)
                    (sparse if isinstance(tensors[i], tf.IndexedSlices) else dense).append(origin)
                context = self._current(dense, sparse)
            except AgreementError:
                raise  # the ranks cannot issue the same collectives: the job must not go on
            except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                self._failed("label a grouped allreduce", exc)
                return original(given, *args, **kwargs)
            with context:
                return original(tensors, *args, **kwargs)

        return grouped_allreduce

    def _capture(self, name: str, var: Any) -> None:
        """Keep the trainable variables the job reduces gradients for: their final values are the
        job's result (compared between modes), their first values tell whether the script seeds."""
        self.variables.add(name, var)

    def _record_initial(self) -> None:
        """Before the first update: equal between two runs only if the script seeds itself."""
        def record(values: dict[str, np.ndarray]) -> None:
            def write() -> None:
                self.tracer.writer.add({"type": "params_initial", "step": self.tracer.step,
                                        "digest": parameters.digest(values), "variables": len(values)})
                if self.initial_parameters and values:
                    parameters.save(self.initial_parameters, values)

            self._guard("save the initial parameters", write)

        self.variables.initial(record, span=lambda: self.tracer.own_work("read and save the initial parameters"))

    def decide_lookups(self, tables: list[tuple[Any, Any]]) -> None:
        """Decide, before the step is traced, for embedding tables whose gradient rows are known
        lookups: ``(variable, ids of the first batch)`` per table (a built-in workload's)."""
        for var, ids in tables:
            self.policy.decide_lookup(_var_name(var), var, ids)

    def record_final(self, path: str | None) -> None:
        """A ``params_final`` record of the captured variables' last values, and (``path``) the values
        saved there; what cannot be read is left out and counted, never raised."""
        def write() -> None:
            if not self.variables:
                return
            with self.tracer.own_work("read and save the final parameters"):
                values = self.variables.final()
                self.tracer.writer.write_now({"type": "params_final", "digest": parameters.digest(values),
                                              "variables": len(values), "captured": len(self.variables)})
                if path is not None and values:
                    parameters.save(path, values)

        self._guard("save the final parameters", write)

    def uninstall(self) -> None:
        for module, attr, original in reversed(self._originals):
            setattr(module, attr, original)
        self._originals.clear()
        self.variables.uninstall()
        optimizer_input.shared().uninstall()

    def _compare_reductions(self, name: str, grad: tf.IndexedSlices, op: Any, compression: Any,
                            process_set: Any) -> None:
        """Reduce the same gradient three ways, with the script's op, compression and process set:
        allgather, dense allreduce, and merge-then-allgather; record how far the dense and the merged
        results differ from the allgather's (``against``: dense or dedup)."""
        writer = self.tracer.writer
        reduce_op = self._op_name(op)
        base = {"type": "reduction_check", "name": name, "reduce_op": reduce_op,
                "compression": self._describe("compression", compression)}
        if reduce_op not in ("average", "sum"):
            # Horovod reduces IndexedSlices with Sum or Average only: there is no sparse path to compare.
            writer.add({**base, "step": self.tracer.step, "skipped": f"op {reduce_op} has no allgather path"})
            return
        kwargs: dict[str, Any] = {"op": op}
        if compression is not None:
            kwargs["compression"] = compression
        if process_set is not None:
            kwargs["process_set"] = process_set
        plain = self._plain_allreduce
        assert plain is not None, "install() keeps Horovod's own allreduce"
        slices = plain(grad, **kwargs)
        reduced = plain(self.policy.densify(grad), **kwargs)
        merged = tf.convert_to_tensor(plain(self.policy.merge(grad), **kwargs))
        self._compare_reduced(base, slices, [(reduced, "dense"), (merged, "dedup")])

    def _compare_reduced(self, base: dict[str, Any], slices: tf.IndexedSlices,
                         others: Sequence[tuple[Any, str]]) -> None:
        """Record how far each dense result in ``others`` (``(tensor, against)``: dense, or dedup where
        the engine merges) differs from ``slices``, the gathered reduction of the same gradient (every
        rank's rows, after the op's scaling, no padding): one ``reduction_check`` record each, from
        ``base`` (name, reduce_op, compression), with float rounding's bound where it applies."""
        writer = self.tracer.writer
        # Only the rows some rank looked up can differ from zero: the results are compared on those (as
        # float64 in numpy) and a dense result must be zero everywhere else. A table-sized float64 copy
        # of each result would cost a verification run several times the job's memory.
        touched, position = tf.unique(slices.indices)
        count = tf.shape(touched, out_type=slices.indices.dtype)[0]
        # The gathered rows summed per index: the same additions, in the same order, as the dense
        # conversion the optimizer's sparse update amounts to.
        gathered = tf.math.unsorted_segment_sum(slices.values, position, count)
        # What each row sums, from the gathered rows themselves (every rank's, after the op's scaling):
        # the number of terms and the sum of their magnitudes, for float rounding's bound. The
        # magnitudes are summed in float32 (n terms: at most gamma(n - 1) below the exact sum, all
        # terms being positive), then raised by 1 / (1 - gamma(n)) to stay an upper bound.
        terms = tf.math.unsorted_segment_sum(tf.ones_like(slices.indices, tf.float64), position, count)
        magnitude = tf.math.unsorted_segment_sum(tf.abs(slices.values), position, count)
        unit = float(np.finfo(slices.values.dtype.as_numpy_dtype).eps) / 2

        def on_touched(dense):
            rows = tf.gather(dense, touched)
            elsewhere = tf.math.count_nonzero(dense, dtype=tf.int64) - tf.math.count_nonzero(rows, dtype=tf.int64)
            return rows, elsewhere

        def emit(a, b, elsewhere, n, total, against):
            a, b, n = np.asarray(a, "float64"), np.asarray(b, "float64"), np.asarray(n)
            total = np.asarray(total, "float64") / np.maximum(1 - gamma(n, unit), unit).reshape((-1,) + (1,) * (a.ndim - 1))
            diff = abs(a - b)
            scale = float(abs(a).max(initial=0.0))
            record = {**base, "step": self.tracer.step, "against": against,
                      "max_abs_diff": float(diff.max(initial=0.0)), "scale": scale,
                      "max_rel_diff": float(diff.max(initial=0.0)) / scale if scale else 0.0,
                      "rows_compared": int(a.shape[0])}
            outside = int(np.asarray(elsewhere))
            if outside:
                # Elements no rank looked up, yet nonzero in this reduction: no summation order explains it.
                record.update(max_abs_diff=float("inf"), max_rel_diff=float("inf"), nonzero_elsewhere=outside)
            if against == "dedup" or record["compression"] in (None, "NoneCompressor"):
                record["rounding_bound_ratio"] = (float("inf") if outside else
                                                  rounding_bound_ratio(diff, a, n, total, unit))
                record["terms_max"] = int(n.max(initial=0))
            writer.add(record)
            return []

        for other, against in others:
            rows, elsewhere = on_touched(other)
            if tf.executing_eagerly():
                emit(gathered, rows, elsewhere, terms, magnitude, against)
            else:
                host_call(lambda a, b, e, n, total, against=against: emit(a, b, e, n, total, against),
                          [gathered, rows, elsewhere, terms, magnitude], name="memdiag_reduction_check")

    # -- op level ---------------------------------------------------------------------------------
    def _wrap_op(self, op: str) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            signature = _signature(original)

            def collective(tensor, *args, **kwargs):
                try:
                    arguments = _bind(signature, (tensor, *args), kwargs)
                    origin = self._op_origin(op, tensor, arguments)
                    # What a rank is inside when it is killed or hangs: marked before the op starts.
                    marks = self._begin(op, [(origin, tensor)])
                except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                    self._failed(f"label an {op}", exc)
                    return original(tensor, *args, **kwargs)
                with tf.control_dependencies(marks), self._abandoned_if_raising(op, [origin]):
                    output = original(tensor, *args, **kwargs)
                # alltoall with splits returns (output, received_splits): the bytes are the output's.
                pair = isinstance(output, (tuple, list))
                received = output[0] if pair else output
                recorded = self._guard(f"record an {op}", lambda: self._record(op, origin, tensor, received, grouped=False))
                if recorded is None or recorded is received:
                    return output
                return type(output)([recorded, *output[1:]]) if pair else recorded

            return collective

        return wrap

    def _wrap_grouped_op(self, op: str) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            signature = _signature(original)

            def grouped(tensors, *args, **kwargs):
                given = tensors
                try:
                    arguments = _bind(signature, (tensors, *args), kwargs)
                    tensors = list(tensors)
                    origins = self._grouped_origins(op, tensors, arguments)
                    marks = self._begin(op, list(zip(origins, tensors)))
                except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                    self._failed(f"label a grouped {op}", exc)
                    return original(given, *args, **kwargs)
                with tf.control_dependencies(marks), self._abandoned_if_raising(op, origins):
                    outputs = original(tensors, *args, **kwargs)

                def record() -> list[Any]:
                    return [self._record(op, origin, tensor, output, grouped=True)
                            for origin, tensor, output in zip(origins, tensors, outputs)]

                recorded = self._guard(f"record a grouped {op}", record)
                if recorded is None or all(r is o for r, o in zip(recorded, outputs)):
                    return outputs
                return type(outputs)(recorded) if isinstance(outputs, (list, tuple)) else recorded

            return grouped

        return wrap

    def _wrap_inplace_broadcast(self, original: Callable) -> Callable:
        def broadcast_(variables, *args, **kwargs):
            given = variables
            try:
                variables = list(variables)
                origins = [Origin(_var_name(var)) for var in variables]
                marks = self._begin("broadcast", list(zip(origins, variables)))
            except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                self._failed("label a broadcast", exc)
                return original(given, *args, **kwargs)
            with tf.control_dependencies(marks), self._abandoned_if_raising("broadcast", origins):
                outputs = original(variables, *args, **kwargs)

            def record() -> list[Any]:
                return [self._record("broadcast", origin, var, output, grouped=True)
                        for origin, var, output in zip(origins, variables, outputs)]

            recorded = self._guard("record a broadcast", record)
            if recorded is None or all(r is o for r, o in zip(recorded, outputs)):
                return outputs
            return type(outputs)(recorded) if isinstance(outputs, (list, tuple)) else recorded

        return broadcast_

    def _op_origin(self, op: str, tensor: Any, arguments: dict[str, Any]) -> Origin:
        """Label for a tensor reaching an op: from the gradient level if it set one."""
        dense, sparse = self._context()
        if op == "allgather" and sparse:
            # An IndexedSlices is gathered as values then indices: both parts carry its label.
            origin = sparse[0]
            if _is_integer(tensor):
                sparse.pop(0)
            return origin
        if op == "allreduce" and dense:
            return dense.pop(0)
        if op == "broadcast" and isinstance(tensor, tf.Variable):
            return Origin(_var_name(tensor))
        return self._unnamed(op, tensor, arguments)

    def _grouped_origins(self, op: str, tensors: list[Any], arguments: dict[str, Any]) -> list[Origin]:
        dense, sparse = self._context()
        if op == "allgather" and sparse:
            # grouped_allreduce gathers all values, then all indices, in the same order.
            origins = sparse[: len(tensors)]
            if tensors and _is_integer(tensors[0]):
                del sparse[: len(tensors)]
            return origins
        return [self._op_origin(op, t, arguments) for t in tensors]

    def _unnamed(self, op: str, tensor: Any, arguments: dict[str, Any]) -> Origin:
        """A collective the gradient level did not label: its own name, else a stable one made of
        the script's call site and the tensor's shape (the same on every step)."""
        name = arguments.get("name")
        process_set = arguments.get("process_set")
        reduce_op = self._op_name(arguments.get("op")) if op in ("allreduce", "reducescatter") else None
        if not name:
            shape = "x".join("?" if d is None else str(d) for d in tensor.shape.as_list()) \
                if tensor.shape.rank is not None else "?"
            name = f"{op}@{_call_site()}[{shape}]"
            if not tf.executing_eagerly():
                name = self._occurrence(name)
        return Origin(name, reduce_op=reduce_op, process_set_size=process_set_size(process_set))

    def _occurrence(self, name: str) -> str:
        """An unnamed collective built into a graph, numbered by its occurrence among those of the same
        call site and shape in that graph (a loop over same-shaped tensors, a helper called twice): the
        second is ``name#2``. A graph's collectives start in no fixed order, and each step's are told
        apart by name (memdiag.agent.tracer); the numbers are the same on every step and every rank,
        since every rank builds the same graph."""
        graph: Any = tf.compat.v1.get_default_graph()
        while isinstance(getattr(graph, "outer_graph", None), FuncGraph):
            graph = graph.outer_graph  # a cond's or a loop's branch: counted in the function around it
        with self._lock:
            counts = self._occurrences.setdefault(graph, collections.Counter())
            counts[name] += 1
            count = counts[name]
        return name if count == 1 else f"{name}#{count}"

    def _begin(self, op: str, items: list[tuple[Origin, Any]]) -> list[Any]:
        """Tell the tracer collectives are starting, with the bytes each will receive; in a graph,
        the returned ops must run before the collective (a control dependency)."""
        metas = [self._meta(op, origin, tensor, grouped=len(items) > 1) for origin, tensor in items]
        world_size = self.world_size()
        in_graph = not tf.executing_eagerly()

        def begin(*shapes) -> list:
            try:
                for meta, shape_in in zip(metas, shapes):
                    shape = [int(d) for d in np.asarray(shape_in)]
                    self.tracer.begin_collective(meta, replay.expected_bytes(op, meta, shape, world_size), in_graph=in_graph)
            except Exception as exc:  # noqa: BLE001 - runs inside the job's step: never raises into it
                self._failed(f"mark an {op}'s start", exc)
            return []

        if tf.executing_eagerly():
            begin(*[tensor.shape for _, tensor in items])
            return []
        if self._native_fits(tensor for _, tensor in items):
            from memdiag.nativemarks import BEGIN

            # one mark per tensor: a record holds a few shapes; a shape known now is kept with the key,
            # not made an op (a constant under a control dependency is a node that runs every step)
            marks = []
            for meta, (_, tensor) in zip(metas, items):
                static, inputs = _mark_inputs([tensor])
                marks.append(self.native.mark(self._native_key(op, meta, world_size, static), BEGIN, inputs))
            return marks
        shapes = [tf.shape(tensor, out_type=tf.int64) for _, tensor in items]
        return [host_call(begin, shapes, name="memdiag_begin")]

    def _native_key(self, op: str, meta: dict[str, Any], world_size: int, static: replay.StaticShapes) -> int:
        """The key of a new native mark: what its records are read back as (:meth:`_dispatch`), with
        the shapes known when the graph was built (the mark's inputs are the others)."""
        with self._lock:
            self._marked.append((op, meta, world_size, static))
            key = len(self._marked) - 1
            if self._keys is not None:
                self._keys.add(key, op, meta, world_size, static)
            return key

    def _native_fits(self, tensors: Any) -> bool:
        """Whether native marks are on and every tensor's shape fits a native record (a known rank of
        at most 8): otherwise the Python call records it."""
        from memdiag.nativemarks import MAX_VALUES

        if self.native is None:
            return False
        ranks = [tensor.shape.rank for tensor in tensors]
        return all(rank is not None and rank <= MAX_VALUES for rank in ranks)

    def _meta(self, op: str, origin: Origin, tensor: Any, grouped: bool) -> dict[str, Any]:
        dtype = tf.as_dtype(tensor.dtype)
        return {
            "op": op,
            "name": origin.name,
            "part": ("indices" if _is_integer(tensor) else "values") if origin.sparse and not origin.densified else None,
            "dtype": dtype.name,
            "itemsize": dtype.size,
            "sparse": origin.sparse,
            "densified": origin.densified,
            "merged": origin.merged,
            "grouped": grouped,
            "gradient": origin.gradient,
            "reduce_op": origin.reduce_op,
            "process_set_size": origin.process_set_size,
        }

    def _record(self, op: str, origin: Origin, tensor: Any, output: Any, grouped: bool) -> Any:
        """Record the collective (at run time in a graph); the output to hand on: ``output`` itself, or
        in a TF1 graph, where only what is fetched runs, an identity of it that waits for the record."""
        meta = self._meta(op, origin, tensor, grouped)
        if tf.executing_eagerly():
            self.tracer.collective(meta, _static_shape(tensor), _static_shape(output))
            return output
        record = self.tracer.collective

        def emit(shape_in, shape_out):
            try:
                record(meta, np.asarray(shape_in).tolist(), np.asarray(shape_out).tolist())
            except Exception as exc:  # noqa: BLE001 - runs inside the job's step: never raises into it
                self._failed(f"record an {op}", exc)
            return []

        # A static shape is a constant that would let the record run before the collective:
        # the control dependency makes it wait for the output, so `t` is the completion time.
        with tf.control_dependencies([output]):
            if self._native_fits([tensor, output]):
                from memdiag.nativemarks import END

                static, inputs = _mark_inputs([tensor, output])
                marked = self.native.mark(self._native_key(op, meta, 0, static), END, inputs)
            else:
                shapes = [tf.shape(tensor, out_type=tf.int64), tf.shape(output, out_type=tf.int64)]
                marked = host_call(emit, shapes, name="memdiag_record")
        return _after(output, marked)

    @contextlib.contextmanager
    def _abandoned_if_raising(self, op: str, origins: list[Origin]) -> Iterator[None]:
        """Where Horovod raises (bad arguments), the collectives marked as started never run: unmark
        them, and let Horovod's error reach the script unchanged."""
        try:
            yield
        except BaseException:
            names = [origin.name for origin in origins]
            self._guard(f"unmark an {op}", lambda: [self.tracer.abandon_collective(op, name) for name in names])
            raise

    # -- context ------------------------------------------------------------------------------------
    def _context(self) -> tuple[list[Origin], list[Origin]]:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else ([], [])

    @contextlib.contextmanager
    def _current(self, dense: list[Origin], sparse: list[Origin]) -> Iterator[None]:
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append((list(dense), list(sparse)))
        try:
            yield
        finally:
            stack.pop()

    @contextlib.contextmanager
    def _queued(self, origins: list[Origin]) -> Iterator[None]:
        previous = getattr(self._local, "queue", None)
        self._local.queue = collections.deque(origins)
        try:
            yield
        finally:
            self._local.queue = previous

    def _take_origin(self, name: str | None, tensor: Any, arguments: dict[str, Any]) -> Origin:
        queue = getattr(self._local, "queue", None)
        if queue:
            return queue.popleft()
        if not name and isinstance(tensor, tf.IndexedSlices) and not tf.executing_eagerly():
            name = _graph_variable(tensor)  # a script's own hvd.allreduce of a gradient it took in a graph
        origin = self._unnamed("allreduce", tensor.values if isinstance(tensor, tf.IndexedSlices) else tensor,
                               {**arguments, "name": name})
        return replace(origin, sparse=isinstance(tensor, tf.IndexedSlices))


def reduction_order(grads: list[Any], variables: list[Any] | None, groups: Any) -> list[int]:
    """Indices of the non-None gradients in the order Horovod reduces them.

    Horovod's ``_make_cached_allreduce_grads_fn`` keeps the gradients' order, except for ``groups``
    given as lists of variables: those groups first, in their own order, then every other gradient.
    """
    present = [i for i, g in enumerate(grads) if g is not None]
    if not isinstance(groups, (list, tuple)) or variables is None:
        return present
    by_name = {_var_name(variables[i]): i for i in present}
    order = []
    for group in groups:
        for var in group:
            index = by_name.pop(_var_name(var), None)
            if index is not None:
                order.append(index)
    return order + list(by_name.values())


def _after(output: Any, ops: Any) -> Any:
    """``output`` (a tensor or an IndexedSlices), made to wait for ``ops`` (an op, or a list: none leaves it
    unchanged) where the graph would otherwise leave them out: a ``tf.function`` (and every
    ``tf.cond``/``tf.while_loop`` branch built in one) runs every stateful op it holds, but a TF1 graph
    runs only what a session fetches and what that depends on, so there the output is handed on through
    an identity that waits for the records (it allocates nothing; an IndexedSlices's values).
    Inside a ``tf.function`` the output is handed on unchanged: an identity there delays the
    collective's consumer until the record has run, which lets TensorFlow reuse the output's buffer
    in place where under plain Horovod it allocates a new one (the average of an allgather's values: a
    gathered buffer less at the peak, which tests/integration/test_memray_trace.py caught; measured:
    docs/notes/transparency.md#in-place-average), and memdiag would no longer measure the job as written."""
    waits = list(ops) if isinstance(ops, (list, tuple)) else [ops]
    values = output.values if isinstance(output, tf.IndexedSlices) else output
    if not waits or not isinstance(values, tf.Tensor) or getattr(values.graph, "_add_control_dependencies", False):
        return output
    with tf.control_dependencies(waits):
        if isinstance(output, tf.IndexedSlices):
            return tf.IndexedSlices(tf.identity(output.values), output.indices, output.dense_shape)
        return tf.identity(output)


def _reducible(arguments: dict[str, Any]) -> bool:
    """Whether Horovod reduces an IndexedSlices with these arguments at all (Sum or Average; no
    pre/postscale): otherwise it raises, and memdiag leaves the call to it unchanged."""
    import horovod.tensorflow as hvd

    op = arguments.get("op")
    average = arguments.get("average")
    if op is None:
        op = hvd.Average if average in (None, True) else hvd.Sum
    return int(op) in (int(hvd.Sum), int(hvd.Average)) and \
        arguments.get("prescale_factor", 1.0) == 1.0 and arguments.get("postscale_factor", 1.0) == 1.0


def _import_keras_frontend() -> None:
    """Horovod's Keras front end, when Keras is there, so that its DistributedOptimizer is hooked too."""
    with contextlib.suppress(Exception):  # no Keras: nothing of it to hook
        import horovod.tensorflow.keras  # noqa: F401


def as_called(wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
              original: Callable[..., Any]) -> Callable[..., Any]:
    """``wrap(original)``, a memdiag wrapper around Horovod's ``original``, made so that autograph treats
    each as plain Horovod would be treated.

    memdiag's own code is never converted by autograph when a script's ``tf.function`` calls it: it
    builds the same graph as plain Python, and converting its closures is neither needed nor reliable
    (a converted method once got its arguments twice). Horovod's function, though, runs as autograph
    would have run it at the wrapper's call site: converted where the script's converted code calls
    it (inside a ``tf.function``), as it is everywhere else. Plain Horovod is converted there, and
    the conversion is a large part of the job's first step (measured:
    docs/notes/transparency.md#autograph-and-the-first-step): left out, memdiag made the job's first
    step faster than the job."""
    from tensorflow.python.autograph.core import ag_ctx
    from tensorflow.python.autograph.impl.api import _call_unconverted, autograph_artifact

    caller = threading.local()  # the autograph status where the wrapper was called

    @functools.wraps(original)
    def original_as_called(*args: Any, **kwargs: Any) -> Any:
        ctx = getattr(caller, "ctx", None)
        if ctx is None or ctx.status != ag_ctx.Status.ENABLED:
            return original(*args, **kwargs)
        # in the caller's status again (memdiag's wrapper ran with autograph off): a function autograph
        # converted already (a closure made by converted code) runs its conversions only then
        with ag_ctx.ControlStatusCtx(status=ctx.status, options=ctx.options):
            return tf.__internal__.autograph.tf_convert(original, ctx)(*args, **kwargs)

    inner = tf.autograph.experimental.do_not_convert(wrap(original_as_called))

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        previous = getattr(caller, "ctx", None)
        # autograph converts what converted code calls (through converted_call, which calls an artifact
        # as it is), not what plain code calls while the status says enabled (a constructor's body)
        through_autograph = sys._getframe(1).f_code is _call_unconverted.__code__
        caller.ctx = tf.__internal__.autograph.control_status_ctx() if through_autograph else None
        try:
            return inner(*args, **kwargs)
        finally:
            caller.ctx = previous

    # an autograph artifact: called unconverted, in the caller's status (do_not_convert would hide it)
    return autograph_artifact(wrapper)


def _signature(function: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _bind(signature: inspect.Signature | None, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name, defaults included (empty if they do not fit the signature)."""
    if signature is None:
        return dict(kwargs)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return dict(kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _rebind(signature: inspect.Signature | None, arguments: dict[str, Any], **changes: Any) -> list[Any]:
    """Positional arguments for the same call with ``changes`` applied."""
    assert signature is not None, "Horovod's _make_allreduce_grads_fn has a Python signature"
    values = {**arguments, **changes}
    return [values[name] for name in signature.parameters if name in values]


def _digest(array: Any) -> str:
    """An exact fingerprint of an array's dtype, shape and bytes."""
    value = np.ascontiguousarray(array)
    h = hashlib.blake2b(f"{value.dtype.str}{value.shape}".encode(), digest_size=12)
    h.update(value.tobytes())
    return h.hexdigest()


def _now() -> np.float64:
    return np.float64(time.perf_counter())


def _describe_process_set(process_set: Any) -> dict[str, Any] | None:
    if process_set is None:
        return None
    return {"id": getattr(process_set, "process_set_id", None), "size": process_set_size(process_set),
            "ranks": list(process_set.ranks) if getattr(process_set, "ranks", None) is not None else None}


def _call_site() -> str:
    """``file:line`` of the innermost frame outside Horovod, TensorFlow and memdiag."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        # autograph's converted copy of a function lives in a temporary file: its caller is stable
        if not (path.startswith(_LIBRARY_DIRS) or "site-packages" in path or path.startswith("<")
                or "__autograph_generated" in path):
            return f"{os.path.basename(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "unknown"


def _var_name(var: Any) -> str:
    return getattr(var, "name", None) or str(var)


# The ops that hold a variable in a graph (TF1 reference variables, resource variables).
_VARIABLE_OPS = ("VariableV2", "Variable", "VarHandleOp")
_GRADIENT_SCOPE = re.compile(r"^(?:.*/)?gradients(?:_\d+)?/(.+?)_grad/")


def _graph_variable(slices: tf.IndexedSlices, depth: int = 6) -> str | None:
    """The variable an IndexedSlices gradient built in a graph is for, where its dense shape is read off
    that variable (as TensorFlow's gather gradient builds it), else None."""
    shape = slices.dense_shape
    if shape is None:
        return None
    starts = [shape.op]
    # A static dense shape is a constant: the gradient's ops are then named after the forward op they
    # differentiate (gradients/<op>_grad/...), whose first input is the variable looked up.
    match = _GRADIENT_SCOPE.match(shape.op.name)
    if match:
        with contextlib.suppress(KeyError, ValueError):
            starts.append(shape.op.graph.get_operation_by_name(match.group(1)))
    for start in starts:
        frontier = [start]
        for _ in range(depth):
            found = next((op for op in frontier if op.type in _VARIABLE_OPS), None)
            if found is not None:
                return f"{found.name}:0"
            frontier = [t.op for op in frontier for t in op.inputs[:1]]
    return None


def _is_integer(tensor: Any) -> bool:
    return tf.as_dtype(tensor.dtype).is_integer


def _mark_inputs(tensors: list[Any]) -> tuple[replay.StaticShapes, list[Any]]:
    """For a native mark of ``tensors``' shapes: each shape known now (fully defined), None where it is
    not, and the mark's inputs: a shape op for each of the others, in order."""
    static = [_static_shape(t) if t.shape.is_fully_defined() else None for t in tensors]
    inputs = [tf.shape(t, out_type=tf.int64) for t, known in zip(tensors, static) if known is None]
    return static, inputs


def _static_shape(tensor: Any) -> list[int]:
    return [int(d) for d in tensor.shape]
