"""Hooks on Horovod's TensorFlow collectives: where collective records come from.

Horovod's public functions are replaced, in the modules that hold them, by wrappers that
(1) apply the densify policy to IndexedSlices gradients before Horovod sees them and
(2) record every collective that reaches Horovod's ops with its runtime shapes.

Two levels are wrapped. The gradient level (``_make_allreduce_grads_fn``, ``allreduce``,
``grouped_allreduce``) knows variable names and IndexedSlices; it decides and labels. The op level
(``_allreduce``, ``allgather``, ``broadcast`` ...) is where bytes move; it records. Labels flow from the
first level to the second through a thread-local context, at graph-construction time.

Inside ``tf.function`` (and Horovod runs its gradient reduction in one even in eager code) shapes are
only known at run time, so the record is written by a ``tf.py_function`` that takes the runtime
shapes of the op's input and output: it runs after the collective, on every step.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import math
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import tensorflow as tf

from memdiag.densify import DensifyPolicy
from memdiag.policy import Decision


@dataclass
class Origin:
    """What a collective's tensor is, as known at the gradient level."""

    name: str
    sparse: bool = False
    densified: bool = False


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
    ) -> None:
        self.tracer = tracer
        self.world_size = world_size
        self.policy = DensifyPolicy(mode, margin, world_size, on_decision, fault)
        self.check_reduction = check_reduction
        self._plain_allreduce: Callable | None = None
        self._local = threading.local()
        self._counter = itertools.count()
        self._originals: list[tuple[Any, str, Any]] = []

    # -- installation -------------------------------------------------------------------------
    def install(self) -> None:
        import horovod.tensorflow as hvd
        import horovod.tensorflow.functions as hvd_functions
        import horovod.tensorflow.mpi_ops as mpi_ops

        gradient_level = {
            "_make_allreduce_grads_fn": self._wrap_make_allreduce_grads_fn,
            "allreduce": self._wrap_allreduce,
            "grouped_allreduce": self._wrap_grouped_allreduce,
        }
        op_level = {
            "_allreduce": self._wrap_op("allreduce"),
            "_grouped_allreduce": self._wrap_grouped_op("allreduce"),
            "allgather": self._wrap_op("allgather"),
            "grouped_allgather": self._wrap_grouped_op("allgather"),
            "broadcast": self._wrap_op("broadcast"),
            "broadcast_": self._wrap_inplace_broadcast,
            "alltoall": self._wrap_op("alltoall"),
            "_reducescatter": self._wrap_op("reducescatter"),
            "_grouped_reducescatter": self._wrap_grouped_op("reducescatter"),
        }
        self._plain_allreduce = hvd.allreduce
        for module in (hvd, mpi_ops, hvd_functions):
            for table in (gradient_level, op_level):
                for attr, wrap in table.items():
                    original = getattr(module, attr, None)
                    if original is None or getattr(original, "__memdiag__", False):
                        continue
                    wrapped = wrap(original)
                    wrapped.__memdiag__ = True
                    wrapped.__wrapped__ = original
                    self._originals.append((module, attr, original))
                    setattr(module, attr, wrapped)

    def uninstall(self) -> None:
        for module, attr, original in reversed(self._originals):
            setattr(module, attr, original)
        self._originals.clear()

    # -- gradient level -------------------------------------------------------------------------
    def _wrap_make_allreduce_grads_fn(self, original: Callable) -> Callable:
        def make(name, device_dense, device_sparse, compression, sparse_as_dense, op, *args, **kwargs):
            # The policy replaces the caller's sparse_as_dense: memdiag decides per tensor.
            inner = original(name, device_dense, device_sparse, compression, False, op, *args, **kwargs)

            def allreduce_grads(grads, vars=None, use_generic_names=False):
                grads = list(grads)
                origins = []
                for i, grad in enumerate(grads):
                    if grad is None:
                        continue
                    var_name = _var_name(vars[i]) if vars is not None else f"grad_{i}"
                    if isinstance(grad, tf.IndexedSlices):
                        if self.check_reduction:
                            self._compare_reductions(var_name, grad)
                        decision = self._decide(var_name, grad, vars[i] if vars is not None else None)
                        if decision.densify:
                            grads[i] = self._densify(grad)
                        origins.append(Origin(var_name, sparse=True, densified=decision.densify))
                    else:
                        origins.append(Origin(var_name))
                with self._queued(origins):
                    return inner(grads, vars, use_generic_names)

            return allreduce_grads

        return make

    def _wrap_allreduce(self, original: Callable) -> Callable:
        def allreduce(tensor, *args, **kwargs):
            origin = self._take_origin(kwargs.get("name"), tensor)
            if isinstance(tensor, tf.IndexedSlices) and not origin.densified:
                if self._decide(origin.name, tensor, None).densify:
                    tensor = self._densify(tensor)
                    origin = replace(origin, densified=True)
            with self._current([origin] if not isinstance(tensor, tf.IndexedSlices) else [], [origin]
                               if isinstance(tensor, tf.IndexedSlices) else []):
                return original(tensor, *args, **kwargs)

        return allreduce

    def _wrap_grouped_allreduce(self, original: Callable) -> Callable:
        def grouped_allreduce(tensors, *args, **kwargs):
            tensors = list(tensors)
            dense, sparse = [], []
            for i, tensor in enumerate(tensors):
                origin = self._take_origin(None, tensor)
                if isinstance(tensor, tf.IndexedSlices) and not origin.densified:
                    if self._decide(origin.name, tensor, None).densify:
                        tensors[i] = self._densify(tensor)
                        origin = replace(origin, densified=True)
                (sparse if isinstance(tensors[i], tf.IndexedSlices) else dense).append(origin)
            with self._current(dense, sparse):
                return original(tensors, *args, **kwargs)

        return grouped_allreduce

    def _compare_reductions(self, name: str, grad: tf.IndexedSlices) -> None:
        """Reduce the same gradient both ways, here, and record how far the dense results differ."""
        gathered = tf.convert_to_tensor(self._plain_allreduce(grad))
        reduced = self._plain_allreduce(self._densify(grad))
        writer = self.tracer.writer

        def emit(a, b):
            a, b = a.numpy().astype("float64"), b.numpy().astype("float64")
            diff = float(abs(a - b).max(initial=0.0))
            scale = float(abs(a).max(initial=0.0))
            writer.add({"type": "reduction_check", "step": self.tracer.step, "name": name,
                        "max_abs_diff": diff, "scale": scale,
                        "max_rel_diff": diff / scale if scale else 0.0})
            return []

        if tf.executing_eagerly():
            emit(gathered, reduced)
        else:
            tf.py_function(emit, [gathered, reduced], Tout=[], name="memdiag_reduction_check")

    def _densify(self, grad: tf.IndexedSlices) -> tf.Tensor:
        return self.policy.densify(grad)

    def _decide(self, name: str, grad: tf.IndexedSlices, var: Any) -> Decision:
        return self.policy.decide(name, grad, var)

    # -- op level ---------------------------------------------------------------------------------
    def _wrap_op(self, op: str) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            def collective(tensor, *args, **kwargs):
                origin = self._op_origin(op, tensor, kwargs.get("name"))
                # What a rank is inside when it is killed or hangs: marked before the op starts.
                with tf.control_dependencies(self._begin(op, origin, tensor)):
                    output = original(tensor, *args, **kwargs)
                self._record(op, origin, tensor, output, grouped=False)
                return output

            return collective

        return wrap

    def _wrap_grouped_op(self, op: str) -> Callable[[Callable], Callable]:
        def wrap(original: Callable) -> Callable:
            def grouped(tensors, *args, **kwargs):
                tensors = list(tensors)
                origins = self._grouped_origins(op, tensors)
                outputs = original(tensors, *args, **kwargs)
                for origin, tensor, output in zip(origins, tensors, outputs):
                    self._record(op, origin, tensor, output, grouped=True)
                return outputs

            return grouped

        return wrap

    def _wrap_inplace_broadcast(self, original: Callable) -> Callable:
        def broadcast_(variables, *args, **kwargs):
            outputs = original(variables, *args, **kwargs)
            for var, output in zip(variables, outputs):
                self._record("broadcast", Origin(_var_name(var)), var, output, grouped=True)
            return outputs

        return broadcast_

    def _op_origin(self, op: str, tensor: Any, name: str | None) -> Origin:
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
        return Origin(name or f"{op}_{next(self._counter)}")

    def _grouped_origins(self, op: str, tensors: list[Any]) -> list[Origin]:
        dense, sparse = self._context()
        if op == "allgather" and sparse:
            # grouped_allreduce gathers all values, then all indices, in the same order.
            origins = sparse[: len(tensors)]
            if tensors and _is_integer(tensors[0]):
                del sparse[: len(tensors)]
            return origins
        return [self._op_origin(op, t, None) for t in tensors]

    def _begin(self, op: str, origin: Origin, tensor: Any) -> list[Any]:
        """Tell the tracer a collective is starting, with the bytes it will receive; in a graph,
        the returned op must run before the collective (a control dependency)."""
        meta = self._meta(op, origin, tensor, grouped=False)
        world_size = self.world_size()

        def begin(shape_in) -> list:
            shape = [int(d) for d in (shape_in.numpy() if hasattr(shape_in, "numpy") else shape_in)]
            expected = math.prod(shape) * meta["itemsize"] * (world_size if op == "allgather" else 1)
            self.tracer.begin_collective(meta, expected)
            return []

        if tf.executing_eagerly():
            begin(tensor.shape)
            return []
        return [tf.py_function(begin, [tf.shape(tensor, out_type=tf.int64)], Tout=[], name="memdiag_begin")]

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
            "grouped": grouped,
        }

    def _record(self, op: str, origin: Origin, tensor: Any, output: Any, grouped: bool) -> None:
        meta = self._meta(op, origin, tensor, grouped)
        if tf.executing_eagerly():
            self.tracer.collective(meta, _static_shape(tensor), _static_shape(output))
            return
        record = self.tracer.collective

        def emit(shape_in, shape_out):
            record(meta, shape_in.numpy().tolist(), shape_out.numpy().tolist())
            return []

        # A static shape is a constant that would let the record run before the collective:
        # the control dependency makes it wait for the output, so `t` is the completion time.
        with tf.control_dependencies([output]):
            shapes = [tf.shape(tensor, out_type=tf.int64), tf.shape(output, out_type=tf.int64)]
            tf.py_function(emit, shapes, Tout=[], name="memdiag_record")

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

    def _take_origin(self, name: str | None, tensor: Any) -> Origin:
        queue = getattr(self._local, "queue", None)
        if queue:
            return queue.popleft()
        sparse = isinstance(tensor, tf.IndexedSlices)
        return Origin(name or f"allreduce_{next(self._counter)}", sparse=sparse)


def _var_name(var: Any) -> str:
    return getattr(var, "name", None) or str(var)


def _is_integer(tensor: Any) -> bool:
    return tf.as_dtype(tensor.dtype).is_integer


def _static_shape(tensor: Any) -> list[int]:
    return [int(d) for d in tensor.shape]
