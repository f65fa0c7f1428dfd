"""Collective records and native marks: each collective's start and end handed to the tracer, and the native marks drained.

Before a collective starts, the tracer is told what it will receive (:meth:`CollectiveRecords._begin`:
what a rank is inside when it is killed or hangs); after it, the record with its shapes
(:meth:`CollectiveRecords._record`). Inside ``tf.function`` (and Horovod runs its gradient reduction in
one even in eager code) shapes are only known at run time, so the record is written by a
``tf.py_function`` that takes the runtime shapes of the op's input and output: it runs after the
collective, on every step. Where the rank loads memdiag's native op (:mod:`memdiag.nativemarks`), a
graph's collectives are marked by it instead, and the marks are read back (:meth:`CollectiveRecords.drain`)
as the records the Python calls would have written.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from memdiag import graphcalls
from memdiag.agent import replay
from memdiag.agent.naming import Origin, is_integer
from memdiag.graphcalls import host_call


class _Outside:
    """The all-reduces of one Horovod cond being built whose marks go outside it: their begin and end
    keys, in the order made (CollectiveRecords._outside_cond); ``graph``: the graph around the cond."""

    __slots__ = ("begins", "ends", "graph")

    def __init__(self, graph: Any) -> None:
        self.begins: list[int] = []
        self.ends: list[int] = []
        self.graph = graph


class _SetUpGroup:
    """The broadcasts of one function graph being built (a script's set-up: ``broadcast_variables``
    broadcasts each variable, and a mark is a node the graph keeps, about 25 KB of a rank's peak each outside a cond:
    probes/mark_node_cost.py): one begin mark, made at the first, that each broadcast waits for, as its
    own would have been (a mark of known shapes has no inputs: it runs when the graph starts), and one
    end mark made when the graph's building ends, after every broadcast's output. Each broadcast keeps
    its own key: the group's marks stand for them all, with their times (the end: the last to
    complete)."""

    __slots__ = ("key", "begin", "ends")

    def __init__(self, key: int, begin: Any) -> None:
        self.key = key
        self.begin = begin
        self.ends: list[tuple[int, Any]] = []  # (key, output) of each broadcast


class _CondEnds:
    """The all-reduces marked around Horovod's conds in one function graph being built
    (:meth:`CollectiveRecords._outside_cond`): one end mark for them all, made when the graph's building
    ends, after every cond's outputs and every begin mark. A gradient reduction is a cond per gradient,
    and an end mark each would be a node per gradient, about 22 KB of a rank's peak each and a share of
    the first call's instantiation (probes/mark_node_cost.py); each all-reduce keeps its own key, and
    carries the time the last of the graph's completed. A cond whose inputs hold at least
    :data:`SHARED_BEGIN_BYTES` has a begin mark of its own; the smaller ones share one, made with the end
    mark, that waits for all their inputs: their records start when the last of them was ready."""

    __slots__ = ("keys", "waits", "begin_keys", "begin_waits")

    def __init__(self) -> None:
        self.keys: list[int] = []  # the end keys of every all-reduce, in the order made
        self.waits: list[Any] = []  # what the end mark waits for: the conds' outputs and the begin marks
        self.begin_keys: list[int] = []  # the begin keys of the small conds' all-reduces (one shared mark)
        self.begin_waits: list[Any] = []  # what their shared begin mark waits for: those conds' inputs


# A cond's inputs below this many bytes share the graph's one begin mark (_CondEnds) rather than have their
# own: a begin mark is a node of about 28 KB of a rank's peak (a tf.function of 500 gradients of 64 bytes,
# traced twice: docs/notes/performance.md), and a collective of less than this cannot move RSS by more.
SHARED_BEGIN_BYTES = 64 * 1024


class CollectiveRecords:
    """Mixin of the hooks (:class:`memdiag.agent.hooks.CollectiveHooks`) that writes their collective
    records; an engine's hooks may add fields to the records (:meth:`_meta`)."""

    tracer: Any
    world_size: Callable[[], int]
    _lock: Any

    if TYPE_CHECKING:
        def _failed(self, what: str, exc: BaseException) -> None: ...

        def _guard(self, what: str, action: Callable[[], Any]) -> Any: ...

    def __init__(self) -> None:
        # Native marks (memdiag.nativemarks), when the rank uses them: what each mark's key stands for
        # (BEGIN: op, meta, world size; END: op, meta), and the drain's guard against re-entry.
        self.native: Any = None
        self._marked: list[replay.Marked] = []
        self._keys: replay.KeysFile | None = None
        self._drain_lock = threading.Lock()
        self._draining = threading.local()
        self.record_every_s = 0.0  # --record-every: the sampler thread drains at most this often (drain_when_due)
        self._last_drain = time.monotonic()
        # The broadcasts of each function graph being built, marked as one group (_SetUpGroup)
        self._set_up: weakref.WeakKeyDictionary[Any, _SetUpGroup] = weakref.WeakKeyDictionary()
        # The all-reduces marked around Horovod's conds in each function graph being built (_CondEnds)
        self._cond_ends: weakref.WeakKeyDictionary[Any, _CondEnds] = weakref.WeakKeyDictionary()
        self._closes_graphs = False
        self._groups_lock = threading.RLock()  # taken before self._lock, never inside it
        self._outside = threading.local()  # .cond: the _Outside of the Horovod cond being built in this thread
        self._begun_shapes = threading.local()  # .made: the Shape ops of the begin being built (_shapes)
        self.begins_shared = 0  # all-reduces of small conds that began with their graph's shared mark

    # -- native marks ---------------------------------------------------------------------------------
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
        if not self._closes_graphs:
            graphcalls.at_scope_exit(self._close_graph)
            self._closes_graphs = True

    def stop_native(self) -> None:
        """No more native marks in graphs built from now on (the hooks are uninstalled)."""
        graphcalls.no_scope_exit(self._close_graph)
        self._closes_graphs = False

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

    def _native_key(self, op: str, meta: dict[str, Any], world_size: int, static: replay.StaticShapes | None) -> int:
        """The key of a new native mark: what its records are read back as (:meth:`_dispatch`), with
        the shapes known when the graph was built (the mark's inputs are the others)."""
        with self._lock:
            self._marked.append((op, meta, world_size, static))
            key = len(self._marked) - 1
            if self._keys is not None:
                self._keys.add(key, op, meta, world_size, static)
            return key

    def _group_key(self, members: list[int]) -> int:
        """The key of one mark that stands for the collectives of ``members`` (keys of their own, every
        shape known when the graph was built), each dispatched with the mark's time."""
        return self._native_key(replay.GROUP, {"members": list(members)}, 0, None)

    def _join_group(self, group: int, member: int) -> None:
        with self._lock:
            self._marked[group][1]["members"].append(member)
            if self._keys is not None:
                self._keys.add_member(group, member)

    @staticmethod
    def _static(tensors: Any) -> bool:
        return all(tensor.shape.is_fully_defined() for tensor in tensors)

    def _set_up_group(self, op: str, tensors: list[Any], begin: bool = False) -> _SetUpGroup | None:
        """The graph's group of broadcasts, where these tensors' broadcasts join it: native marks on,
        every shape known, inside a function graph being built (whose end closes the group); made, with
        its begin mark, by the ``begin`` of a broadcast. None: each is marked on its own."""
        if op != "broadcast" or not self._native_fits(tensors) or not self._static(tensors):
            return None
        graph = tf.compat.v1.get_default_graph()
        if not getattr(graph, "building_function", False) or not getattr(graph, "_add_control_dependencies", False):
            return None  # a TF1 graph runs only what is fetched; without the scope nothing closes the group
        from memdiag.nativemarks import BEGIN

        with self._groups_lock:
            group = self._set_up.get(graph)
            if group is None and begin:
                key = self._group_key([])
                with tf.control_dependencies(None):  # shared: it waits for nothing the first broadcast waits for
                    group = self._set_up[graph] = _SetUpGroup(key, self.native.mark(key, BEGIN, []))
            return group

    def _close_graph(self, graph: Any) -> None:
        """The end of ``graph``'s building: one mark after every broadcast of its group, and one after
        every all-reduce marked around a cond (_CondEnds)."""
        with self._groups_lock:
            group = self._set_up.pop(graph, None)
            conds = self._cond_ends.pop(graph, None)
        from memdiag.nativemarks import BEGIN, END

        def end(keys: list[int], waits: list[Any]) -> None:
            key = keys[0] if len(keys) == 1 else self._group_key(keys)
            with graph.as_default(), tf.control_dependencies(None), tf.control_dependencies(waits):
                self.native.mark(key, END, [])

        if group is not None and group.ends:  # counted where it fails: a warning in the report
            self._guard("mark the end of a graph's broadcasts",
                        lambda: end([k for k, _ in group.ends], [o for _, o in group.ends]))
        if conds is not None and conds.keys:
            def ends() -> None:
                waits = conds.waits
                if conds.begin_keys:  # the small conds' shared begin, before the end that waits for it
                    key = conds.begin_keys[0] if len(conds.begin_keys) == 1 else self._group_key(conds.begin_keys)
                    with graph.as_default(), tf.control_dependencies(None), \
                            tf.control_dependencies(conds.begin_waits):
                        waits = [*waits, self.native.mark(key, BEGIN, [])]
                end(conds.keys, waits)

            self._guard("mark the end of a graph's all-reduces", ends)

    def _native_fits(self, tensors: Any) -> bool:
        """Whether native marks are on and every tensor's shape fits a native record (a known rank of
        at most 8): otherwise the Python call records it."""
        from memdiag.nativemarks import MAX_VALUES

        if self.native is None:
            return False
        ranks = [tensor.shape.rank for tensor in tensors]
        return all(rank is not None and rank <= MAX_VALUES for rank in ranks)

    def _shapes(self) -> dict[Any, Any]:
        """The shape ops made for the begin marks of the collective being built in this thread, by tensor
        (:func:`mark_inputs`), so that its end reads its input's shape from the same op. Each begin starts
        them anew: an op made in one control-dependency or control-flow context is not handed to another
        (in a TF1 graph a session would run what it waits for)."""
        made: dict[Any, Any] = getattr(self._begun_shapes, "made", {})
        return made

    def _through(self, tensors: list[Any], outputs: list[Any]) -> bool:
        """Whether ``outputs`` are marked on their path (:meth:`memdiag.nativemarks.Marks.mark_through`):
        native marks that can, in a graph that runs only what is fetched (where :func:`after` would hand
        them on through an Identity), every tensor's shape fitting a record, every output a tensor of
        values (not a reference, a resource or a variant)."""
        if self.native is None or not getattr(self.native, "through", False) or not self._native_fits(tensors):
            return False
        for output in outputs:
            if not isinstance(output, tf.Tensor) or getattr(output.graph, "_add_control_dependencies", False):
                return False
            dtype = output.dtype
            if dtype._is_ref_dtype or dtype in (tf.resource, tf.variant):  # noqa: SLF001 - TensorFlow's own test
                return False
        return True

    def _outside_cond(self, build: Callable[[], Any], inputs: Any, runs: bool) -> Any:
        """``build()``: Horovod's ``tf.cond`` of one reduction (``_allreduce_cond``), its all-reduces
        marked outside the cond, in the graph around it: a begin mark after the cond's inputs, and one
        end mark for all the graph's conds, made when its building ends, after their outputs and begins
        (:class:`_CondEnds`; without the scope's hook, an end mark after each cond's). A mark inside a
        branch makes the cond a stateful ``If``, which TensorFlow instantiates at a far higher cost than
        the stateless one plain Horovod builds (probes/mark_node_cost.py, ``cond-`` variants). ``runs``:
        the cond's predicate, known when the graph is built (the process set has this rank and more than
        one); where it is false
        the branch never runs, and nothing is marked. Inside a function graph with native marks only;
        an all-reduce whose shapes are not all known now keeps its marks inside."""
        def tensors(value: Any) -> list[Any]:
            return [t for t in tf.nest.flatten(value, expand_composites=True) if isinstance(t, tf.Tensor)]

        graph = tf.compat.v1.get_default_graph()
        if self.native is None or tf.executing_eagerly() or not getattr(graph, "building_function", False) \
                or not getattr(graph, "_add_control_dependencies", False) \
                or not all(t.graph is graph for t in tensors(inputs)):
            return build()
        outside = _Outside(graph)
        previous = getattr(self._outside, "cond", None)
        self._outside.cond = outside
        try:
            result = build()
        finally:
            self._outside.cond = previous
        if not runs or not outside.begins:
            return result
        from memdiag.nativemarks import BEGIN, END

        def key(members: list[int]) -> int:
            return members[0] if len(members) == 1 else self._group_key(members)

        def mark() -> None:
            waited = tensors(inputs)
            if self._closes_graphs and outside.ends and _bytes(waited) < SHARED_BEGIN_BYTES:
                # a small cond: its begin is the graph's shared one, made with the end mark (_CondEnds)
                with self._groups_lock:
                    ends = self._cond_ends_of(graph)
                    ends.begin_keys += outside.begins
                    ends.begin_waits += waited
                    ends.keys += outside.ends
                    ends.waits += tensors(result)
                    self.begins_shared += len(outside.begins)
                return
            with tf.control_dependencies(None):
                with tf.control_dependencies(waited):
                    begin = self.native.mark(key(outside.begins), BEGIN, [])
                if not outside.ends:
                    return
                if self._closes_graphs:  # the graph's end closes them: one end mark for all its conds
                    with self._groups_lock:
                        ends = self._cond_ends_of(graph)
                        ends.keys += outside.ends
                        ends.waits += [*tensors(result), begin]
                    return
                with tf.control_dependencies([*tensors(result), begin]):
                    self.native.mark(key(outside.ends), END, [])

        self._guard("mark an all-reduce around its cond", mark)
        return result

    def _cond_ends_of(self, graph: Any) -> _CondEnds:
        """The conds marked so far in ``graph`` being built (:class:`_CondEnds`), made at the first
        (``_groups_lock`` held)."""
        ends = self._cond_ends.get(graph)
        if ends is None:
            ends = self._cond_ends[graph] = _CondEnds()
        return ends

    def _outside_cond_fits(self, op: str, tensors: list[Any]) -> _Outside | None:
        """The cond being built, where this collective's marks go outside it (:meth:`_outside_cond`)."""
        outside = getattr(self._outside, "cond", None)
        if outside is None or op != "allreduce" or not self._native_fits(tensors) or not self._static(tensors):
            return None
        return outside if tf.compat.v1.get_default_graph() is not outside.graph else None

    # -- records ----------------------------------------------------------------------------------------
    def _begin(self, op: str, items: list[tuple[Origin, Any]]) -> list[Any]:
        """Tell the tracer collectives are starting, with the bytes each will receive; in a graph,
        the returned ops must run before the collective (a control dependency)."""
        metas = [self._meta(op, origin, tensor, grouped=len(items) > 1) for origin, tensor in items]
        world_size = self.world_size()
        in_graph = not tf.executing_eagerly()

        def begin(*shapes: Any) -> list[Any]:
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
        tensors = [tensor for _, tensor in items]
        made: dict[Any, Any] = {}  # this collective's shape ops, not the one's before it (_shapes)
        self._begun_shapes.made = made
        outside = self._outside_cond_fits(op, tensors)
        if outside is not None:
            outside.begins += [self._native_key(op, meta, world_size, [static_shape(tensor)])
                               for meta, tensor in zip(metas, tensors)]
            return []
        set_up = self._set_up_group(op, tensors, begin=True)
        if set_up is not None:
            # a function graph's broadcasts (a script's set-up) begin together, at the graph's start: one mark
            for meta, tensor in zip(metas, tensors):
                self._join_group(set_up.key, self._native_key(op, meta, world_size, [static_shape(tensor)]))
            return [set_up.begin]
        if self._native_fits(tensors):
            from memdiag.nativemarks import BEGIN

            if len(items) > 1 and self._static(tensors):
                # one op of many tensors, every shape known now: one mark stands for all of them
                members = [self._native_key(op, meta, world_size, [static_shape(tensor)])
                           for meta, tensor in zip(metas, tensors)]
                return [self.native.mark(self._group_key(members), BEGIN, [])]
            # one mark per tensor: a record holds a few shapes; a shape known now is kept with the key,
            # not made an op (a constant under a control dependency is a node that runs every step)
            marks = []
            for meta, tensor in zip(metas, tensors):
                static, inputs = mark_inputs([tensor], made)
                marks.append(self.native.mark(self._native_key(op, meta, world_size, static), BEGIN, inputs))
            return marks
        shapes = [tf.shape(tensor, out_type=tf.int64) for _, tensor in items]
        return [host_call(begin, shapes, name="memdiag_begin")]

    def _meta(self, op: str, origin: Origin, tensor: Any, grouped: bool) -> dict[str, Any]:
        dtype = tf.as_dtype(tensor.dtype)
        return {
            "op": op,
            "name": origin.name,
            "part": ("indices" if is_integer(tensor) else "values") if origin.sparse and not origin.densified else None,
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
        in a TF1 graph, where only what is fetched runs, the output handed on by the native mark
        (:meth:`_through`) or an identity of it that waits for the record."""
        meta = self._meta(op, origin, tensor, grouped)
        if tf.executing_eagerly():
            self.tracer.collective(meta, static_shape(tensor), static_shape(output))
            return output
        record = self.tracer.collective

        def emit(shape_in: Any, shape_out: Any) -> list[Any]:
            try:
                record(meta, np.asarray(shape_in).tolist(), np.asarray(shape_out).tolist())
            except Exception as exc:  # noqa: BLE001 - runs inside the job's step: never raises into it
                self._failed(f"record an {op}", exc)
            return []

        outside = self._outside_cond_fits(op, [tensor, output])
        if outside is not None:
            outside.ends.append(self._native_key(op, meta, 0, [static_shape(tensor), static_shape(output)]))
            return output
        set_up = self._set_up_group(op, [tensor, output])
        if set_up is not None:
            # ended with the graph's other broadcasts: one mark after them all (_close_graph)
            key = self._native_key(op, meta, 0, [static_shape(tensor), static_shape(output)])
            with self._groups_lock:
                set_up.ends.append((key, output))
            return output
        if self._through([tensor, output], [output]):
            # a TF1 graph: the mark on the output's path, which hands it on and reads its shape itself
            from memdiag.nativemarks import END

            static, inputs = mark_inputs([tensor], self._shapes())
            known = output.shape.is_fully_defined()
            key = self._native_key(op, meta, 0, [*static, static_shape(output) if known else None])
            return self.native.mark_through(key, END, [output], inputs, [] if known else [0])[0]
        # A static shape is a constant that would let the record run before the collective:
        # the control dependency makes it wait for the output, so `t` is the completion time.
        with tf.control_dependencies([output]):
            if self._native_fits([tensor, output]):
                from memdiag.nativemarks import END

                static, inputs = mark_inputs([tensor, output], self._shapes())
                marked = self.native.mark(self._native_key(op, meta, 0, static), END, inputs)
            else:
                shapes = [tf.shape(tensor, out_type=tf.int64), tf.shape(output, out_type=tf.int64)]
                marked = host_call(emit, shapes, name="memdiag_record")
        return after(output, marked)

    def _record_all(self, op: str, origins: list[Origin], tensors: list[Any], outputs: list[Any]) -> list[Any]:
        """:meth:`_record` for the outputs of one op of many tensors. Where every shape is known now and
        the marks are native, one mark after all of the op's outputs (which it completes at once) stands
        for each; the broadcasts of a function graph's group end with the group."""
        if tf.executing_eagerly() or len(outputs) < 2 or not self._native_fits([*tensors, *outputs]) \
                or not self._static([*tensors, *outputs]) or self._set_up_group(op, tensors) is not None \
                or self._outside_cond_fits(op, [*tensors, *outputs]) is not None:
            return [self._record(op, origin, tensor, output, grouped=True)
                    for origin, tensor, output in zip(origins, tensors, outputs)]
        from memdiag.nativemarks import END

        members = [self._native_key(op, self._meta(op, origin, tensor, grouped=True), 0,
                                    [static_shape(tensor), static_shape(output)])
                   for origin, tensor, output in zip(origins, tensors, outputs)]
        if self._through([*tensors, *outputs], outputs):  # a TF1 graph: one mark on all the outputs' paths
            handed_on: list[Any] = self.native.mark_through(self._group_key(members), END, list(outputs), [], [])
            return handed_on
        with tf.control_dependencies(list(outputs)):
            marked = self.native.mark(self._group_key(members), END, [])
        return [after(output, marked) for output in outputs]

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


def after(output: Any, ops: Any) -> Any:
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


def mark_inputs(tensors: list[Any], made: dict[Any, Any] | None = None) -> tuple[replay.StaticShapes, list[Any]]:
    """For a native mark of ``tensors``' shapes: each shape known now (fully defined), None where it is
    not, and the mark's inputs: a shape op for each of the others, in order. ``made``: the shape ops made
    for the begin marks of the collective being built (by tensor), reused (its begin and end read its
    input's shape from one op) and added to."""
    static: replay.StaticShapes = [static_shape(t) if t.shape.is_fully_defined() else None for t in tensors]
    inputs = []
    for t, known in zip(tensors, static):
        if known is not None:
            continue
        shape = made.get(t.ref()) if made is not None else None
        if shape is None:
            shape = tf.shape(t, out_type=tf.int64)
            if made is not None:
                made[t.ref()] = shape
        inputs.append(shape)
    return static, inputs


def static_shape(tensor: Any) -> list[int]:
    return [int(d) for d in tensor.shape]


def _bytes(tensors: list[Any]) -> float:
    """The bytes of ``tensors`` by the shapes known now; infinite where one is not fully known."""
    total = 0
    for tensor in tensors:
        if not tensor.shape.is_fully_defined():
            return float("inf")
        try:
            total += tensor.shape.num_elements() * tensor.dtype.size
        except (TypeError, ValueError):  # a dtype of no fixed size (a resource, a variant, a string)
            return float("inf")
    return total
