"""What the optimizer is handed for a gradient ``auto`` keeps gathered: the gathered rows, or those rows
summed into a dense gradient, where the optimizer's own update with the rows holds more than with the
dense gradient.

``auto`` weighs the bytes the collectives move: a table whose gathered rows are far smaller than the
table keeps the allgather. The optimizer then takes an IndexedSlices, and for some optimizers that is
no saving at all: Keras 2's Adam applies one as ``m.assign_add(-m * (1 - beta_1))`` and a scatter (the
same for v), then a step over the whole table, so its update holds table-sized temporaries as the dense
update does, and in a ``tf.function`` more. ``probes/optimizer_update_peak.py`` measures, per
optimizer, one update's peak with the tape's IndexedSlices and with the same gradient made dense (which
holds a table-sized gradient more). The optimizers whose sparse update peaked
higher beyond the noise in one of its settings at least (oneDNN on, as TensorFlow sets it, and off) and
lower in neither are :data:`DENSE_UPDATE`. For those, a gradient ``auto`` kept gathered is summed into a
dense gradient (``tf.convert_to_tensor``, as Horovod's ``sparse_as_dense`` does before its allreduce)
right before the optimizer's update: the collective stays the small gather, and the update is the dense
one. The table is by how the update is called, built in a graph (a ``tf.function``, Keras's ``fit``) or
eagerly, op by op, where every temporary is freed as soon as it is used: eagerly, Keras's Adam, Nadam and
SGD held less with the rows with oneDNN off, and take them; the legacy Adam held more both ways. Keras's
SGD is handed dense without momentum only (with 0.9 its graph update was level within noise). Other
optimizers (Adagrad, RMSprop, the legacy SGD, and any optimizer not measured, such as TF1's
``tf.compat.v1.train`` ones) get the gathered rows. What the optimizer is handed changes no collective:
the reduction is done by then.

The conversion happens inside the optimizer's ``apply_gradients`` (Keras 2's optimizers and their
legacy ones, which Horovod's ``DistributedOptimizer`` and Keras's ``fit`` call too), for the variables
whose gradient ``auto`` kept gathered (:meth:`OptimizerInput.keep`), only: a script's own IndexedSlices,
and every gradient in any other mode, reach the optimizer as before. The sum of the gathered rows is
the dense allreduce's sum in another order: float rounding apart, the update is the same.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, cast

# Optimizer classes (module, name) whose update with an IndexedSlices gradient was measured to peak above
# its update with the same gradient dense, in one setting of oneDNN at least and below it in neither
# (probes/optimizer_update_peak.py [--eager], TensorFlow 2.15; measured:
# docs/notes/comparisons.md#where-auto-peaks-above-dense-the-optimizers-sparse-update), by how the update
# was called: "graph" (built in a tf.function, as Keras's fit does) and "eager" (op by op). Each value is
# the sparse path's peak minus the dense path's (which holds the dense gradient), oneDNN on / off, as
# measured then; only the keys ("graph", "eager") decide, the figures are not read. Keras's
# SGD is one class with or without momentum: without, its sparse update in a graph still scales a
# table-sized momentum slot and peaked higher; with momentum 0.9 the two paths were level within noise,
# so only an SGD without momentum is handed dense. Eager, Keras's Adam, Nadam and SGD peaked lower with
# the rows with oneDNN off, so they take the rows there.
DENSE_UPDATE: dict[tuple[str, str], dict[str, str]] = {
    ("keras.src.optimizers.adam", "Adam"): {"graph": "+246 / +52 MiB"},
    ("keras.src.optimizers.nadam", "Nadam"): {"graph": "+402 / +92 MiB"},
    ("keras.src.optimizers.sgd", "SGD"): {"graph": "+148 / +227 MiB without momentum"},  # momentum 0 only
    ("keras.src.optimizers.legacy.adam", "Adam"): {"graph": "+124 / +18 MiB", "eager": "+765 / +523 MiB"},
}

# Called once per variable when its gathered gradient is first handed to the optimizer dense:
# (name of the gradient's tensor, the optimizer's class name).
OnDense = Callable[[str, str], None]


def dense_update(optimizer: Any, eager: bool = False) -> str | None:
    """The name of ``optimizer``'s measured class whose sparse update holds more than its dense one when
    called as it is (``eager`` or in a graph), the first in its class's method order (so Horovod's
    ``DistributedOptimizer``, made as a subclass of the script's optimizer, counts as it); else None."""
    for cls in type(optimizer).__mro__:
        measured = DENSE_UPDATE.get((cls.__module__, cls.__name__))
        if measured is not None:
            if cls.__name__ == "SGD" and _momentum(optimizer) != 0:  # with momentum 0.9: within noise
                return None
            return cls.__name__ if ("eager" if eager else "graph") in measured else None
    return None


def _momentum(optimizer: Any) -> float | None:
    """The optimizer's momentum, where it is a plain number (None: unknown, e.g. a schedule)."""
    try:
        return float(optimizer.momentum)
    except (AttributeError, TypeError, ValueError):
        return None


class OptimizerInput:
    """The variables whose gradient ``auto`` kept gathered, and the hook that hands them to an optimizer
    of :data:`DENSE_UPDATE` dense. One per process (:func:`shared`): the agent's policy and the drop-ins'
    register with it; the hook is installed once, when the first variable is kept."""

    def __init__(self) -> None:
        self._kept: dict[Any, tuple[str, OnDense | None]] = {}
        self._told: set[tuple[Any, str]] = set()
        self._lock = threading.Lock()
        self._originals: list[tuple[Any, str, Any]] = []

    def keep(self, var: Any, name: str, on_dense: OnDense | None = None) -> None:
        """``auto`` keeps ``var``'s gradient gathered: an optimizer of :data:`DENSE_UPDATE` gets it dense."""
        ref = _ref(var)
        if ref is None:
            return
        with self._lock:
            self._kept.setdefault(ref, (name, on_dense))
            if not self._originals:
                self._install()

    def convert(self, optimizer: Any, grads_and_vars: Any) -> Any:
        """``grads_and_vars`` as ``optimizer`` should take them: the kept variables' IndexedSlices dense,
        where its class is in :data:`DENSE_UPDATE`; otherwise as they came."""
        if not self._kept:
            return grads_and_vars
        import tensorflow as tf

        which = dense_update(optimizer, eager=tf.executing_eagerly())
        if which is None:
            return grads_and_vars

        pairs = list(grads_and_vars)
        out = []
        for grad, var in pairs:
            ref = _ref(var)
            if isinstance(grad, tf.IndexedSlices) and ref is not None and ref in self._kept:
                grad = tf.convert_to_tensor(grad)
                name, on_dense = self._kept[ref]
                with self._lock:
                    first = (ref, which) not in self._told
                    self._told.add((ref, which))
                if on_dense is not None and first:
                    on_dense(name, which)
            out.append((grad, var))
        return out

    def _install(self) -> None:
        """Wrap ``apply_gradients`` of Keras 2's optimizer base classes (the new and the legacy)."""
        try:
            import tensorflow as tf

            bases = [tf.keras.optimizers.Optimizer, tf.keras.optimizers.legacy.Optimizer]
        except (ImportError, AttributeError):  # no Keras 2 optimizers (Keras 3): nothing to hand dense
            return
        for base in bases:
            original = vars(base).get("apply_gradients")
            if original is None or getattr(original, "__memdiag__", False):
                continue
            self._originals.append((base, "apply_gradients", original))
            base.apply_gradients = _wrapped(original, self)

    def uninstall(self) -> None:
        with self._lock:
            for owner, attr, original in reversed(self._originals):
                setattr(owner, attr, original)
            self._originals.clear()
            self._kept.clear()
            self._told.clear()


def _wrapped(original: Callable[..., Any], hand: OptimizerInput) -> Callable[..., Any]:
    """``original`` with the gradients converted first. Keras's ``apply_gradients`` is one autograph never
    converts (its module is allowlisted), so the wrapper is an autograph artifact: a script's converted
    ``tf.function`` calls it, and through it Keras's method, unconverted, as a plain run does."""
    from tensorflow.python.autograph.impl.api import autograph_artifact

    @functools.wraps(original)
    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        return original(self, hand.convert(self, grads_and_vars), *args, **kwargs)

    apply_gradients.__memdiag__ = True  # type: ignore[attr-defined]
    return cast(Callable[..., Any], autograph_artifact(apply_gradients))


def _ref(var: Any) -> Any:
    """A hashable key for a variable (``var.ref()``), or None for anything else."""
    ref = getattr(var, "ref", None)
    try:
        return ref() if callable(ref) else None
    except Exception:  # noqa: BLE001 - not a variable
        return None


_SHARED: list[OptimizerInput] = []


def shared() -> OptimizerInput:
    """The process's one :class:`OptimizerInput`."""
    if not _SHARED:
        _SHARED.append(OptimizerInput())
    return _SHARED[0]
