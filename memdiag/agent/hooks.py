"""Hooks on Horovod's TensorFlow collectives: Horovod's functions replaced by wrappers that label, decide and record.

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
reductions (which ``groups=`` changes; :func:`memdiag.agent.naming.reduction_order` follows Horovod's
own rule).

:class:`CollectiveHooks` is the façade: it installs the wrappers and counts memdiag's own failures; the
wrappers work through its collaborators, each in a module of its own:

- :mod:`memdiag.agent.calls`: a wrapper's call, its arguments by name, and autograph's view of it;
- :mod:`memdiag.agent.choices`: the script's choices (``choices`` records);
- :mod:`memdiag.agent.naming`: each collective's label, or the name made for it;
- :mod:`memdiag.agent.policy_apply`: the policy applied to each IndexedSlices gradient;
- :mod:`memdiag.agent.parameter_records`: the parameters captured, and their records;
- :mod:`memdiag.agent.reduction_check`: ``--check-reduction``'s comparison of the reductions;
- :mod:`memdiag.agent.collective_records`: the collective records and native marks (a mixin).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import tensorflow as tf

from memdiag import graphcalls, optimizer_input
from memdiag.agent import calls, reduction_check
from memdiag.agent.choices import ScriptChoices, describe_process_set
from memdiag.agent.collective_records import CollectiveRecords, after
from memdiag.agent.failures import Failures
from memdiag.agent.naming import Labels, Origin, reduction_order, var_name
from memdiag.agent.parameter_records import ParameterRecords
from memdiag.agent.policy_apply import PolicyApplication, reducible
from memdiag.agreement import AgreementError
from memdiag.compat import paired
from memdiag.densify import DensifyPolicy, process_set_size
from memdiag.policy import Decision, horovod_op_names


class CollectiveHooks(CollectiveRecords):
    """One rank's hooks on Horovod: the wrappers installed and uninstalled, memdiag's own failures counted."""

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
        super().__init__()
        self.tracer = tracer
        self.world_size = world_size
        self.policy = DensifyPolicy(mode, margin, world_size, on_decision, fault)
        self.check_reduction = check_reduction
        self.fingerprint_gradients = fingerprint_gradients
        self._plain_allreduce: Callable | None = None
        self._originals: list[tuple[Any, str, Any]] = []
        self.on_init: Callable[[], None] | None = None  # called once, when the script calls hvd.init()
        # memdiag's own failures inside a hook, by what failed: counted and reported, never raised
        self.failures = Failures(tracer)
        self._lock: Any = threading.Lock()
        self.choices = ScriptChoices(tracer)
        self.labels = Labels(self.choices.op_name)
        # initial_parameters: where to save the parameters before the first update
        self.parameters = ParameterRecords(tracer, initial_parameters, self.failures)
        self.applied = PolicyApplication(self.policy, tracer, self.labels, world_size, self.failures)

    # -- installation -------------------------------------------------------------------------
    def install(self) -> None:
        import horovod.tensorflow as hvd
        import horovod.tensorflow.mpi_ops as mpi_ops

        self.choices.ops = horovod_op_names(hvd)
        tables: dict[str, dict[str, Callable[[Callable], Callable]]] = {
            "constructors": {"DistributedGradientTape": self._wrap_constructor("DistributedGradientTape"),
                             "DistributedOptimizer": self._wrap_constructor("DistributedOptimizer")},
            "gradient": {"_make_allreduce_grads_fn": self._wrap_make_allreduce_grads_fn,
                         "allreduce": self._wrap_allreduce,
                         "grouped_allreduce": self._wrap_grouped_allreduce,
                         "_allreduce_cond": self._wrap_cond,
                         "_grouped_allreduce_cond": self._wrap_cond},
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
                    wrapped: Any = calls.as_called(wrap, original)
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

    def uninstall(self) -> None:
        for module, attr, original in reversed(self._originals):
            setattr(module, attr, original)
        self._originals.clear()
        self.stop_native()
        self.parameters.variables.uninstall()
        optimizer_input.shared().uninstall()

    # -- memdiag's own failures -------------------------------------------------------------------
    def _failed(self, what: str, exc: BaseException) -> None:
        """memdiag could not do ``what`` (label, record, read a variable): :meth:`Failures.failed`."""
        self.failures.failed(what, exc)

    def _guard(self, what: str, action: Callable[[], Any]) -> Any:
        """``action()``, or None where it fails: :meth:`Failures.guard`."""
        return self.failures.guard(what, action)

    # -- the rank's calls ---------------------------------------------------------------------------
    def decide_lookups(self, tables: list[tuple[Any, Any]]) -> None:
        """Decide, before the step is traced, for embedding tables whose gradient rows are known
        lookups: ``(variable, ids of the first batch)`` per table (a built-in workload's)."""
        for var, ids in tables:
            self.policy.decide_lookup(var_name(var), var, ids)

    def record_final(self, path: str | None) -> None:
        """The ``params_final`` record (:meth:`ParameterRecords.record_final`)."""
        self.parameters.record_final(path)

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
            signature = calls.signature(original)
            frontend = "keras" if "keras" in (original.__module__ or "") else "tensorflow"

            def constructor(*args, **kwargs):
                def record() -> None:
                    arguments = calls.bind(signature, args, kwargs)
                    choices = {k: self.choices.describe(k, v) for k, v in arguments.items()
                               if k not in ("gradtape", "optimizer", "name", "device_dense", "device_sparse")}
                    self.choices.record({"api": f"{frontend}.{api}", **choices})

                self._guard(f"record the choices of {api}", record)
                return original(*args, **kwargs)

            return constructor

        return wrap

    # -- gradient level -------------------------------------------------------------------------
    def _wrap_make_allreduce_grads_fn(self, original: Callable) -> Callable:
        signature = calls.signature(original)

        def make(*args, **kwargs):
            try:
                arguments = calls.bind(signature, args, kwargs)
                script_densifies = bool(arguments.get("sparse_as_dense"))
                # memdiag converts (as Horovod would have) so that it can label, and decide, per tensor.
                inner = original(*calls.rebind(signature, arguments, sparse_as_dense=False))
            except Exception as exc:  # noqa: BLE001 - Horovod's own call decides what the script gets
                self._failed("hook the gradient reduction", exc)
                return original(*args, **kwargs)
            op, compression = arguments.get("op"), arguments.get("compression")
            process_set, groups = arguments.get("process_set"), arguments.get("groups")
            self.choices.record({"api": "gradient reduction", "sparse_as_dense": script_densifies,
                                 "op": self.choices.op_name(op),
                                 "compression": self.choices.describe("compression", compression),
                                 "process_set": describe_process_set(process_set),
                                 "groups": self.choices.describe("groups", groups),
                                 "gradient_predivide_factor": arguments.get("gradient_predivide_factor")})
            reduce_op = self.choices.op_name(op)
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
                with self.labels.queued([origins[i] for i in order]):
                    reduced = reduce_inner(grads, vars, use_generic_names)
                if not at_run_time:
                    return reduced
                reduced = list(reduced)
                for i, (grad, var) in at_run_time.items():
                    reduced[i] = self.applied.reduce_at_run_time(origins[i], grad, var, script_densifies,
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
                items = [(var_name(var) if var is not None else f"grad_{i}", grad, var)
                         for i, (grad, var) in enumerate(paired(grads, variables))]
                if self.policy.mode == "auto":
                    # New tensors agreed in the order of their names, whatever order a rank lists them in.
                    self.policy.decide_in_name_order(items, script_densifies, process_set,
                                                     run_time_ok=reduce_op in ("average", "sum"), reduce_op=reduce_op)
                for i, (name, grad, var) in enumerate(items):
                    if grad is None:
                        continue
                    self.parameters.capture(name, var)
                    origin = Origin(name, gradient=True, reduce_op=reduce_op, process_set_size=set_size)
                    if isinstance(grad, tf.IndexedSlices):
                        with graphcalls.collected() as made:
                            if self.fingerprint_gradients:
                                self.applied.fingerprint(name, grad)
                            if self.check_reduction:
                                reduction_check.compare_reductions(self.tracer, self.policy, self.choices,
                                                                   self._plain_allreduce, name, grad, op,
                                                                   compression, process_set)
                            run_time = (reduce_op in ("average", "sum")
                                        and self.policy.needs_run_time(grad, var, process_set, name))
                            if not run_time:
                                grads[i], densified, merged = self.applied.apply(name, grad, var, script_densifies,
                                                                                 process_set, reduce_op)
                        # In a TF1 graph the records made here run only if what the script fetches waits for them.
                        waiting = graphcalls.unreached(made)
                        if run_time:
                            # Reduced below, by the path the first step's agreed rows choose.
                            at_run_time[i] = (after(grad, waiting), var)
                            grads[i] = None
                            origins[i] = replace(origin, sparse=True)
                            continue
                        grads[i] = after(grads[i], waiting)
                        origin = replace(origin, sparse=True, densified=densified, merged=merged)
                    origins[i] = origin
                self.parameters.before_first_update()
                return grads, origins, at_run_time

            def with_inner(inner_as_called: Callable[..., Any]) -> Callable[..., Any]:
                nonlocal reduce_inner
                reduce_inner = inner_as_called
                return allreduce_grads

            return calls.as_called(with_inner, inner)

        return make

    def _wrap_allreduce(self, original: Callable) -> Callable:
        signature = calls.signature(original)

        def allreduce(tensor, *args, **kwargs):
            given = tensor
            if _refused_by_horovod(signature, tensor, args, kwargs):
                return original(given, *args, **kwargs)
            try:
                arguments = calls.bind(signature, (tensor, *args), kwargs)
                origin = self.labels.take_origin(arguments.get("name"), tensor, arguments)
                if isinstance(tensor, tf.IndexedSlices) and not origin.gradient and reducible(arguments):
                    # A script's own hvd.allreduce of an IndexedSlices: the policy applies as well.
                    with graphcalls.collected() as made:
                        tensor, densified, merged = self.applied.apply(origin.name, tensor, None, False,
                                                                       arguments.get("process_set"), count=False)
                    tensor = after(tensor, graphcalls.unreached(made))
                    origin = replace(origin, densified=densified, merged=merged)
                sparse = isinstance(tensor, tf.IndexedSlices)
                context = self.labels.current([] if sparse else [origin], [origin] if sparse else [])
            except AgreementError:
                raise  # the ranks cannot issue the same collectives: the job must not go on
            except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                self._failed("label an allreduce", exc)
                return original(given, *args, **kwargs)
            with context:
                return original(tensor, *args, **kwargs)

        return allreduce

    def _wrap_grouped_allreduce(self, original: Callable) -> Callable:
        signature = calls.signature(original)

        def grouped_allreduce(tensors, *args, **kwargs):
            given = tensors
            if _refused_by_horovod(signature, given, args, kwargs):
                return original(given, *args, **kwargs)
            try:
                arguments = calls.bind(signature, (tensors, *args), kwargs)
                tensors = list(tensors)
                dense: list[Origin] = []
                sparse: list[Origin] = []
                for i, tensor in enumerate(tensors):
                    origin = self.labels.take_origin(None, tensor, arguments)
                    if isinstance(tensor, tf.IndexedSlices) and not origin.gradient and reducible(arguments):
                        with graphcalls.collected() as made:
                            tensors[i], densified, merged = self.applied.apply(origin.name, tensor, None, False,
                                                                               arguments.get("process_set"),
                                                                               count=False)
                        tensors[i] = after(tensors[i], graphcalls.unreached(made))
                        origin = replace(origin, densified=densified, merged=merged)
                    (sparse if isinstance(tensors[i], tf.IndexedSlices) else dense).append(origin)
                context = self.labels.current(dense, sparse)
            except AgreementError:
                raise  # the ranks cannot issue the same collectives: the job must not go on
            except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                self._failed("label a grouped allreduce", exc)
                return original(given, *args, **kwargs)
            with context:
                return original(tensors, *args, **kwargs)

        return grouped_allreduce

    def _wrap_cond(self, original: Callable) -> Callable:
        """Horovod's ``tf.cond`` around each gradient's all-reduce (``_allreduce_cond``, and
        ``_grouped_allreduce_cond`` for ``groups=``): its collectives marked outside the cond
        (:meth:`CollectiveRecords._outside_cond`). The predicate is Horovod's own, known when the graph
        is built; under elastic Horovod it is a run-time op, and the marks stay inside."""
        signature = calls.signature(original)

        def cond(tensor, *args, **kwargs):
            runs = None  # the predicate, where it is known when the graph is built
            with contextlib.suppress(Exception):  # unknown: marked inside the cond, as any other collective
                process_set = calls.bind(signature, (tensor, *args), kwargs).get("process_set")
                if process_set is not None and not int(os.environ.get("HOROVOD_ELASTIC", 0) or 0):
                    runs = bool(process_set.included() and process_set.size() > 1)
            if runs is None:
                return original(tensor, *args, **kwargs)
            return self._outside_cond(lambda: original(tensor, *args, **kwargs), tensor, runs)

        return cond

    # -- op level ---------------------------------------------------------------------------------
    def _wrap_op(self, op: str) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            signature = calls.signature(original)

            def collective(tensor, *args, **kwargs):
                try:
                    arguments = calls.bind(signature, (tensor, *args), kwargs)
                    origin = self.labels.op_origin(op, tensor, arguments)
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
            signature = calls.signature(original)

            def grouped(tensors, *args, **kwargs):
                given = tensors
                try:
                    arguments = calls.bind(signature, (tensors, *args), kwargs)
                    tensors = list(tensors)
                    origins = self.labels.grouped_origins(op, tensors, arguments)
                    marks = self._begin(op, list(zip(origins, tensors)))
                except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                    self._failed(f"label a grouped {op}", exc)
                    return original(given, *args, **kwargs)
                with tf.control_dependencies(marks), self._abandoned_if_raising(op, origins):
                    outputs = original(tensors, *args, **kwargs)

                recorded = self._guard(f"record a grouped {op}",
                                       lambda: self._record_all(op, origins, tensors, list(outputs)))
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
                origins = [Origin(var_name(var)) for var in variables]
                marks = self._begin("broadcast", list(zip(origins, variables)))
            except Exception as exc:  # noqa: BLE001 - Horovod's own call, as if unhooked
                self._failed("label a broadcast", exc)
                return original(given, *args, **kwargs)
            with tf.control_dependencies(marks), self._abandoned_if_raising("broadcast", origins):
                outputs = original(variables, *args, **kwargs)

            recorded = self._guard("record a broadcast",
                                   lambda: self._record_all("broadcast", origins, variables, list(outputs)))
            if recorded is None or all(r is o for r, o in zip(recorded, outputs)):
                return outputs
            return type(outputs)(recorded) if isinstance(outputs, (list, tuple)) else recorded

        return broadcast_


def _refused_by_horovod(signature: Any, tensors: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether Horovod refuses this all-reduce before any collective runs: an IndexedSlices with an op or
    scale factor it does not reduce them with (policy_apply.reducible). memdiag leaves such a call to
    Horovod, which raises its own error, without labelling what it cannot label: an IndexedSlices of
    Horovod's own test file holds a Python list for values. False where the call cannot be read (then
    the hook goes on as for any call)."""
    try:
        if not any(isinstance(t, tf.IndexedSlices) for t in (tensors if isinstance(tensors, (list, tuple))
                                                              else [tensors])):
            return False
        return not reducible(calls.bind(signature, (tensors, *args), kwargs))
    except Exception:  # noqa: BLE001 - not readable: the hook's own path decides
        return False


def _import_keras_frontend() -> None:
    """Horovod's Keras front end, when Keras is there, so that its DistributedOptimizer is hooked too."""
    with contextlib.suppress(Exception):  # no Keras: nothing of it to hook
        import horovod.tensorflow.keras  # noqa: F401
