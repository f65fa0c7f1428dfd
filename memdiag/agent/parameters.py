"""The parameters a user's script trains, read where they can be read: what `compare` checks between modes.

The gradient hooks see every variable whose gradient the script reduces. Their values are read at two
moments, the first reduction (before the first update: ``params_initial``) and the end of the script
(``params_final``), and never in a way that can fail the job:

- an eager variable is read eagerly (``tf.init_scope``);
- a variable of a ``tf.compat.v1`` graph has no eager value: it is read through the session that runs
  its graph, with the session's own ``run`` of the variable itself (no op is added, so a finalized
  graph is fine), after the first ``Session.run`` that leaves it initialized (initial values) and when the
  session closes (final values). Only then are the session's methods wrapped, and only while such
  variables exist;
- a variable that cannot be read at all (its graph went out of scope, its session never initialized it)
  is left out, and counted.

A graph's variables are held by weak reference, so that holding them never keeps a graph the script
discarded alive; eager variables are held until the end, when they are read after the script's own
references are gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np


class ParameterCapture:
    """Variables by name (the first one seen of each name), and where their values come from."""

    def __init__(self, on_failure: Callable[[str, BaseException], None]) -> None:
        self._refs: dict[str, Callable[[], Any]] = {}
        self._from_session: dict[str, np.ndarray[Any, Any]] = {}  # graph variables: last values read through a session
        self._on_failure = on_failure
        self._on_initial: Callable[[Iterator[tuple[str, np.ndarray[Any, Any]]]], None] | None = None
        self._initial_span: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext
        self._lock = threading.Lock()
        self._session_hooks: list[tuple[Any, str, Any]] = []

    def __len__(self) -> int:
        return len(self._refs)

    def __bool__(self) -> bool:
        return bool(self._refs)

    def add(self, name: str, var: Any) -> None:
        if var is None or name in self._refs:
            return
        if _in_graph(var):
            # A graph's variable: its values come through its session, so holding it weakly is enough,
            # and holding it strongly would keep a graph the script discarded alive.
            try:
                self._refs[name] = weakref.ref(var)
            except TypeError:
                self._refs[name] = _strong(var)
            self._hook_sessions()
        else:
            # An eager variable is read at the end, after the script's own references are gone.
            self._refs[name] = _strong(var)

    # -- reading ----------------------------------------------------------------------------------
    def _eager(self) -> dict[str, Any]:
        """The variables with an eager value, by name."""
        live = {name: ref() for name, ref in self._refs.items()}
        return {name: var for name, var in live.items() if var is not None and not _in_graph(var)}

    def _read(self, var: Any) -> np.ndarray[Any, Any] | None:
        import tensorflow as tf

        from memdiag.workloads.loop import value_view

        try:
            with tf.init_scope():
                return value_view(var)  # the variable's value read now, without a copy
        except Exception as exc:  # noqa: BLE001 - a variable of a graph gone out of scope
            self._on_failure("read a parameter", exc)
            return None

    def each_eager(self) -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
        """Every variable that has an eager value, in name order, each read as it is reached, as a view of
        its value (no copy: :func:`memdiag.workloads.loop.value_view`): whoever takes them one at a time
        holds one variable's value at a time, which the variable's own buffer holds anyway."""
        eager = self._eager()
        for name in sorted(eager):
            value = self._read(eager[name])
            if value is not None:
                yield name, value
            del value  # not held while the next is read

    def initial(self, record: Callable[[Iterator[tuple[str, np.ndarray[Any, Any]]]], None],
                span: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext) -> None:
        """``record(values)`` once, with the values before the first update, (name, value) in name
        order: now for eager variables (each read as ``record`` reaches it), after the first session
        run that initializes them for a graph's. Reading and recording run inside ``span()`` (the
        tracer's own-work span: in no step's figures)."""
        with span():
            if self._eager() or not self._graph_variables():
                record(self.each_eager())
                return
        self._on_initial = record
        self._initial_span = span

    def final_items(self) -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
        """The last values in name order: eager variables each read as it is reached, graph variables
        as their session left them."""
        eager = self._eager()
        for name in sorted(set(self._from_session) | set(eager)):
            value = self._read(eager[name]) if name in eager else None
            if value is None:
                value = self._from_session.get(name)
            if value is not None:
                yield name, value
            del value  # not held while the next is read

    def final(self) -> dict[str, np.ndarray[Any, Any]]:
        """The last values: eager variables read now, graph variables as their session left them."""
        return dict(self.final_items())

    # -- graph mode: through the session -------------------------------------------------------------
    def _graph_variables(self) -> dict[str, Any]:
        live = {name: ref() for name, ref in self._refs.items()}
        return {name: var for name, var in live.items() if var is not None and _in_graph(var)}

    def _read_through(self, session: Any, run: Callable[..., Any]) -> dict[str, np.ndarray[Any, Any]] | None:
        ours = {name: var for name, var in self._graph_variables().items() if var.graph is session.graph}
        if not ours:
            return None
        try:
            arrays = run(session, list(ours.values()))
        except Exception:  # noqa: BLE001 - not initialized yet (or no longer readable): try later
            return None
        return {name: np.array(a) for name, a in zip(ours, arrays)}

    def _hook_sessions(self) -> None:
        if self._session_hooks:
            return
        from tensorflow.python.client import session as tf_session

        cls = tf_session.BaseSession
        original_run, original_close = cls.run, cls.close
        capture = self

        def run(session: Any, *args: Any, **kwargs: Any) -> Any:
            result = original_run(session, *args, **kwargs)
            if capture._on_initial is not None:
                with capture._lock, capture._initial_span():
                    record, values = capture._on_initial, None
                    if record is not None:
                        values = capture._read_through(session, original_run)
                        if values is not None:
                            capture._on_initial = None
                    if record is not None and values is not None:
                        record(iter(sorted(values.items())))
            return result

        def close(session: Any) -> None:
            if not getattr(session, "_closed", True):
                with capture._lock:
                    values = capture._read_through(session, original_run)
                    if values is not None:
                        capture._from_session.update(values)
            original_close(session)

        wrappers: list[tuple[str, Any, Any]] = [("run", run, original_run), ("close", close, original_close)]
        for attr, wrapper, original in wrappers:
            wrapper.__wrapped__ = original
            self._session_hooks.append((cls, attr, original))
            setattr(cls, attr, wrapper)

    def uninstall(self) -> None:
        for cls, attr, original in reversed(self._session_hooks):
            setattr(cls, attr, original)
        self._session_hooks.clear()


def digest(values: dict[str, np.ndarray[Any, Any]]) -> str | None:
    """Exact fingerprint of the values, in name order (None: no values)."""
    if not values:
        return None
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(values):
        h.update(np.ascontiguousarray(values[name]).tobytes())
    return h.hexdigest()


def digest_and_save(path: str | None, values: Iterable[tuple[str, np.ndarray[Any, Any]]]) -> tuple[str | None, int]:
    """:func:`digest` of ``values`` ((name, value) in name order), and with ``path`` the values saved there
    (:func:`memdiag.workloads.loop.save_arrays`), one value at a time: a value read lazily
    (``each_eager``, a view of its value) is held only while it is hashed and written, so memdiag copies no
    variable of the model (on ResNet50, 98 MiB) but a graph's, which its session returns as copies. Returns
    the digest (None: no values) and how many values there were."""
    from memdiag.workloads.loop import save_arrays

    h = hashlib.blake2b(digest_size=16)

    def hashed() -> Iterator[tuple[str, np.ndarray[Any, Any]]]:
        for name, value in values:
            h.update(np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)
            yield name, value
            del value  # not held while the next is read

    count = sum(1 for _ in hashed()) if path is None else save_arrays(path, hashed(), empty=False)
    return (h.hexdigest() if count else None), count


def _strong(var: Any) -> Callable[[], Any]:
    return lambda: var


def _in_graph(var: Any) -> bool:
    """Whether ``var`` belongs to a ``tf.compat.v1`` graph (no eager value), not to eager execution
    or a ``tf.function``."""
    try:
        graph = var.graph
    except Exception:  # noqa: BLE001 - an eager variable's handle has no graph (each kind says so its own way)
        return False
    return graph is not None and not getattr(graph, "building_function", False)
