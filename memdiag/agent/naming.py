"""What each collective is called: the label (Origin) the gradient level hands the op level, or a stable name made for it.

Labels flow from the gradient level to the op level in the order Horovod issues the reductions (which
``groups=`` changes; :func:`reduction_order` follows Horovod's own rule): a queue of labels for the
allreduce calls to come, and, per allreduce call, the labels of the dense tensors and IndexedSlices its
ops will carry (:class:`Labels`). A collective no label reaches is named by the script (``name=``), or
after the script's call site and the tensor's shape, numbered in each graph.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph

from memdiag.densify import process_set_size

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


class Labels:
    """The labels in flight in each thread, and the names of unlabelled collectives."""

    def __init__(self, op_name: Callable[[Any], str]) -> None:
        self._op_name = op_name  # the name of a Horovod reduce op (memdiag.agent.choices)
        self._local = threading.local()
        self._lock = threading.Lock()
        # per graph being built: how many unnamed collectives of each call site and shape it holds
        self._occurrences: weakref.WeakKeyDictionary[Any, collections.Counter[str]] = weakref.WeakKeyDictionary()

    # -- the gradient level's labels ------------------------------------------------------------------
    def context(self) -> tuple[list[Origin], list[Origin]]:
        stack: list[tuple[list[Origin], list[Origin]]] | None = getattr(self._local, "stack", None)
        return stack[-1] if stack else ([], [])

    @contextlib.contextmanager
    def current(self, dense: list[Origin], sparse: list[Origin]) -> Iterator[None]:
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append((list(dense), list(sparse)))
        try:
            yield
        finally:
            stack.pop()

    @contextlib.contextmanager
    def queued(self, origins: list[Origin]) -> Iterator[None]:
        previous = getattr(self._local, "queue", None)
        self._local.queue = collections.deque(origins)
        try:
            yield
        finally:
            self._local.queue = previous

    def take_origin(self, name: str | None, tensor: Any, arguments: dict[str, Any]) -> Origin:
        queue: collections.deque[Origin] | None = getattr(self._local, "queue", None)
        if queue:
            return queue.popleft()
        if not name and isinstance(tensor, tf.IndexedSlices) and not tf.executing_eagerly():
            name = graph_variable(tensor)  # a script's own hvd.allreduce of a gradient it took in a graph
        origin = self.unnamed("allreduce", tensor.values if isinstance(tensor, tf.IndexedSlices) else tensor,
                              {**arguments, "name": name})
        return replace(origin, sparse=isinstance(tensor, tf.IndexedSlices))

    # -- the op level -----------------------------------------------------------------------------------
    def op_origin(self, op: str, tensor: Any, arguments: dict[str, Any]) -> Origin:
        """Label for a tensor reaching an op: from the gradient level if it set one."""
        dense, sparse = self.context()
        if op == "allgather" and sparse:
            # An IndexedSlices is gathered as values then indices: both parts carry its label.
            origin = sparse[0]
            if is_integer(tensor):
                sparse.pop(0)
            return origin
        if op == "allreduce" and dense:
            return dense.pop(0)
        if op == "broadcast" and isinstance(tensor, tf.Variable):
            return Origin(var_name(tensor))
        return self.unnamed(op, tensor, arguments)

    def grouped_origins(self, op: str, tensors: list[Any], arguments: dict[str, Any]) -> list[Origin]:
        dense, sparse = self.context()
        if op == "allgather" and sparse:
            # grouped_allreduce gathers all values, then all indices, in the same order.
            origins = sparse[: len(tensors)]
            if tensors and is_integer(tensors[0]):
                del sparse[: len(tensors)]
            return origins
        return [self.op_origin(op, t, arguments) for t in tensors]

    # -- collectives without a label ----------------------------------------------------------------------
    def unnamed(self, op: str, tensor: Any, arguments: dict[str, Any]) -> Origin:
        """A collective the gradient level did not label: its own name, else a stable one made of
        the script's call site and the tensor's shape (the same on every step)."""
        name = arguments.get("name")
        process_set = arguments.get("process_set")
        reduce_op = self._op_name(arguments.get("op")) if op in ("allreduce", "reducescatter") else None
        if not name:
            shape = "x".join("?" if d is None else str(d) for d in tensor.shape.as_list()) \
                if tensor.shape.rank is not None else "?"
            name = f"{op}@{call_site()}[{shape}]"
            if not tf.executing_eagerly():
                name = self.occurrence(name)
        return Origin(name, reduce_op=reduce_op, process_set_size=process_set_size(process_set))

    def occurrence(self, name: str) -> str:
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


def reduction_order(grads: list[Any], variables: list[Any] | None, groups: Any) -> list[int]:
    """Indices of the non-None gradients in the order Horovod reduces them.

    Horovod's ``_make_cached_allreduce_grads_fn`` keeps the gradients' order, except for ``groups``
    given as lists of variables: those groups first, in their own order, then every other gradient.
    """
    present = [i for i, g in enumerate(grads) if g is not None]
    if not isinstance(groups, (list, tuple)) or variables is None:
        return present
    by_name = {var_name(variables[i]): i for i in present}
    order = []
    for group in groups:
        for var in group:
            index = by_name.pop(var_name(var), None)
            if index is not None:
                order.append(index)
    return order + list(by_name.values())


def call_site() -> str:
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


def var_name(var: Any) -> str:
    return getattr(var, "name", None) or str(var)


# The ops that hold a variable in a graph (TF1 reference variables, resource variables).
_VARIABLE_OPS = ("VariableV2", "Variable", "VarHandleOp")
_GRADIENT_SCOPE = re.compile(r"^(?:.*/)?gradients(?:_\d+)?/(.+?)_grad/")


def graph_variable(slices: tf.IndexedSlices, depth: int = 6) -> str | None:
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


def is_integer(tensor: Any) -> bool:
    """Whether a tensor's dtype is an integer's (an IndexedSlices' indices, not its values)."""
    return bool(tf.as_dtype(tensor.dtype).is_integer)
