"""memdiag's Python calls inside a job's graph, made so that they do not order the graph.

A record of a collective is written by a Python call (``tf.numpy_function``) that runs where the graph
reaches it (before the collective, and after it with its run-time shapes). Such an op is stateful, and inside a
``tf.function`` TensorFlow's automatic control dependencies run the stateful ops that use no resource
one after another, in the order they were built; a ``tf.cond`` branch holding one becomes a stateful
``If`` and is ordered the same way. Horovod's own ops are stateless, and each gradient's all-reduce
sits in a ``tf.cond`` of its own (``_allreduce_cond``), so under plain Horovod the all-reduces of a
step start as their gradients are ready and Horovod fuses those that meet in a cycle. With ordered
records, each all-reduce waited for the previous one's record, that is for its completion: one
collective per cycle, no fusion, and a job that is not the one written
(tests/unit/test_graph_order.py; Horovod's timeline showed one all-reduce per cycle with ordered records,
and with this module about as many cycles as under plain mpirun: measured,
docs/notes/transparency.md#records-that-ordered-the-graph).

So every such op is marked (:data:`MARK`) and, while memdiag is installed, each automatic-control-
dependencies scope lets marked ops, and control flow whose only stateful ops are marked, run
independently (``AutomaticControlDependencies.run_independently``: they still run on every call of
the function, in no order with the rest). A stateless op would not be ordered either, but TensorFlow's
graph optimizer drops one that nothing consumes from a ``tf.cond`` branch, and folds it into a constant
where its inputs are static shapes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

MARK = "_memdiag_host_call"

_exit_hooks: list[Callable[[Any], None]] = []  # called with the graph as a scope of it ends (at_scope_exit)
_made = threading.local()  # the lists :func:`collected` is filling in this thread, innermost last


def host_call(function: Callable[..., Any], inputs: Sequence[Any], name: str, Tout: Any = ()) -> Any:  # noqa: N803
    """``function`` called with ``inputs`` as numpy arrays where the graph reaches this op: a stateful
    ``tf.numpy_function`` (cheaper than ``tf.py_function``: no eager tensors are made for it), marked as
    memdiag's own so that it orders nothing while :func:`install` is in force. Returns its outputs, or
    with no ``Tout`` the op itself."""
    graph = tf.compat.v1.get_default_graph()
    result = tf.numpy_function(function, list(inputs), Tout=list(Tout) if isinstance(Tout, (list, tuple)) else Tout,
                               stateful=True, name=name)
    if isinstance(result, tf.Tensor):
        op = result.op
    elif isinstance(result, (list, tuple)) and result and isinstance(result[0], tf.Tensor):
        op = result[0].op
    else:  # no outputs: the op just made
        op = result = graph.get_operations()[-1]
    _mark(op)
    for made in getattr(_made, "stack", ()):
        made.append(op)
    return result


@contextlib.contextmanager
def collected() -> Iterator[list[Any]]:
    """The ops :func:`host_call` makes in this thread inside the ``with`` block, in the order made."""
    made: list[Any] = []
    stack = _made.__dict__.setdefault("stack", [])
    stack.append(made)
    try:
        yield made
    finally:
        stack.remove(made)


def unreached(ops: Sequence[Any]) -> list[Any]:
    """Those of ``ops`` that a TF1 graph would never run: in a graph that is not a function's (a
    ``tf.function`` runs every stateful op it holds), the ops whose outputs nothing consumes. A session
    runs only what it fetches and what that depends on, so such a record must be made a control input
    of something the script fetches."""
    return [op for op in ops if not getattr(op.graph, "building_function", True)
            and not any(out.consumers() for out in op.outputs)]


def _mark(op: Any) -> None:
    """Mark ``op`` as memdiag's; where TensorFlow refuses, it stays unmarked (ordered as TensorFlow
    orders it) rather than fail the job's graph."""
    from tensorflow.core.framework import attr_value_pb2

    with contextlib.suppress(Exception):  # never an error in the job's graph
        op._set_attr(MARK, attr_value_pb2.AttrValue(b=True))


# The ops memdiag marks: its native mark, tf.numpy_function's, and the control flow holding them.
_MARKABLE = frozenset({"MemdiagMark", "PyFunc", "If", "While", "Case"})


def _marked(op: Any) -> bool:
    if op.type not in _MARKABLE:
        return False  # without the attribute lookup, which raises for most ops
    try:
        return bool(op.get_attr(MARK))
    except ValueError:
        return False


def _branches(op: Any) -> list[Any] | None:
    """The function graphs of a functional control-flow op, as TensorFlow keeps them on the op (If:
    ``_true_graph``/``_false_graph``; While: ``_cond_graph``/``_body_graph``; Case:
    ``_branch_graph_0``, ``_branch_graph_1``, ...), or None."""
    graphs = [getattr(op, attr, None) for attr in ("_true_graph", "_false_graph", "_cond_graph", "_body_graph")]
    i = 0
    while getattr(op, f"_branch_graph_{i}", None) is not None:
        graphs.append(getattr(op, f"_branch_graph_{i}"))
        i += 1
    found = [g for g in graphs if g is not None]
    return found or None


def _only_marked_effects(op: Any) -> bool:
    """Whether ``op`` is stateful only through memdiag's host calls: one itself, or control flow whose
    branches hold no other stateful op (inner control flow was judged, and marked, when its own scope
    ended)."""
    if not op._is_stateful:
        return False  # memdiag's own ops are stateful: most of a graph is judged here, without an attribute lookup
    if _marked(op):
        return True
    branches = _branches(op)
    if branches is None:
        return False
    stateful = [o for g in branches for o in g.get_operations() if o._is_stateful]
    return bool(stateful) and all(_marked(o) for o in stateful)


def at_scope_exit(hook: Callable[[Any], None]) -> None:
    """Call ``hook(graph)`` as each automatic-control-dependencies scope of a graph ends without an
    error, before the scope judges its ops (while :func:`install` is in force): what it adds to the graph
    is judged with the rest."""
    if hook not in _exit_hooks:
        _exit_hooks.append(hook)


def no_scope_exit(hook: Callable[[Any], None]) -> None:
    with contextlib.suppress(ValueError):
        _exit_hooks.remove(hook)


def install() -> list[tuple[Any, str, Any]]:
    """Let every automatic-control-dependencies scope run memdiag's host calls independently (see the
    module's text); returns what was replaced, as (owner, attribute, original), for the caller to put
    back."""
    from tensorflow.python.framework import auto_control_deps

    manager = auto_control_deps.AutomaticControlDependencies
    original = manager.__exit__
    if getattr(original, "__memdiag__", False):
        return []

    def __exit__(self: Any, *exc: Any) -> Any:  # noqa: N807 - the context manager's own method
        # a TensorFlow without these internals keeps its own order: never an error in the job's graph
        graph = getattr(self, "_graph", None)
        if graph is not None and exc[:1] == (None,):
            for hook in list(_exit_hooks):
                with contextlib.suppress(Exception):  # a hook counts its own failures
                    hook(graph)  # ops made here are the scope's too: judged below
        with contextlib.suppress(Exception):
            if graph is not None and not tf.executing_eagerly():
                for op in graph.get_operations()[self._n_operations:]:
                    if _only_marked_effects(op):
                        if not _marked(op):
                            _mark(op)  # control flow: the scope around it judges it as a host call
                        self.run_independently(op)
        return original(self, *exc)

    __exit__.__memdiag__ = True  # type: ignore[attr-defined]
    manager.__exit__ = __exit__
    return [(manager, "__exit__", original)]
