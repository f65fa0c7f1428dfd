"""What each worker receives when MultiWorkerMirroredStrategy reduces an IndexedSlices gradient.

A standalone probe for issue 12, launched by mpirun, one TensorFlow worker per MPI rank::

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python probes/tf_distribute_gather.py [--densify] [--eager] \\
        [--rows-base 1000 --rows-step 500 --width 256 --vocab 5000 --steps 2] [--horovod]

Rank 0 picks N free loopback ports and broadcasts them with mpi4py; each rank then writes its
TF_CONFIG (``worker`` r at ``localhost:P_r``) before TensorFlow is imported, and builds
``tf.distribute.MultiWorkerMirroredStrategy()``. The workload is a custom training loop:
``strategy.run`` of a step that looks an embedding table (vocab x width, float32) up
``rows_base + rank x rows_step`` times on worker ``rank`` (uneven rows on purpose), feeds a Dense(1)
head, takes ``tape.gradient`` and calls ``optimizer.apply_gradients`` (Keras SGD: Keras 2 under
TF 2.15, Keras 3 under TF >= 2.16). The embedding's gradient is an IndexedSlices of ``rows`` rows.

Hooks (monkeypatches of module and class attributes, installed before the first trace):

* ``cross_device_utils.CollectiveReplicaLauncher.all_reduce_indexed_slices``: marks the gathers
  inside it as the sparse path. The first is the row-count gather (``lengths``), then values and
  indices alternate: the plain branch of its ``cond`` gathers values, indices; the padded branch
  does the same on padded tensors.
* ``cross_device_utils._pad_util``: marks the next gather as padded.
* ``collective_ops.all_gather_v2`` and ``collective_ops.all_reduce_v2``: record what each worker
  sends (input shape) and receives (output shape) at run time. In a ``tf.function`` (the default)
  a ``tf.py_function`` fed ``tf.shape(input)``, ``tf.shape(output)`` (and, for the lengths gather,
  the gathered lengths) runs after the collective; the output goes on through a ``tf.identity``
  under a control dependency on it, so it runs every step. A record made inside a ``cond`` branch
  runs only when that branch does. With ``--eager`` the shapes are read directly.

Rank 0 prints, per step and worker, the bytes received by the values and indices gathers, the
formula N x max_rows x (row_bytes + index_bytes), whether they are equal, and the padding
(N x max_rows - sum of rows) x (row_bytes + index_bytes). With ``--densify`` the IndexedSlices is
turned dense (``tf.convert_to_tensor``) before ``apply_gradients`` and the dense all-reduce bytes
are shown instead. "Received" means the bytes of the collective's output tensor on that worker.

``--horovod`` (main .venv only) runs the same lookups without MWMS and reduces the gradient with
``hvd.allreduce(op=hvd.Sum)`` instead: a baseline in which every worker receives the sum of all rows.

The end: an MPI barrier, ``MPI.Finalize()``, then ``os._exit`` (gRPC teardown of MWMS can hang or abort otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
from typing import Any, NoReturn

from mpi4py import MPI

PROG = "tf_distribute_gather"
PHASE = {"now": "setup"}  # set while tracing (or running eagerly): which part of the step issues a collective
STEP = {"now": -1}  # set by the loop before each step; read when a record is made (run time)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--rows-base", type=int, default=1000, help="lookups on worker 0")
    p.add_argument("--rows-step", type=int, default=500, help="extra lookups per worker rank")
    p.add_argument("--width", type=int, default=256, help="embedding width (float32)")
    p.add_argument("--vocab", type=int, default=5000, help="embedding rows")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--densify", action="store_true", help="dense gradients before apply_gradients")
    p.add_argument("--eager", action="store_true", help="no tf.function: strategy.run eagerly")
    p.add_argument("--timeout", type=float, default=0.0, help="collective timeout in seconds (0: none)")
    p.add_argument("--json", default="", help="also write every record to this file (rank 0)")
    p.add_argument("--horovod", action="store_true",
                   help="baseline: the same lookups reduced by Horovod's hvd.allreduce (eager), no MWMS")
    return p.parse_args(argv)


def free_ports(n: int) -> list[int]:
    """N distinct free loopback ports: bind port 0 N times (all held at once), then release."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Recorder:
    """Records of one worker: one dict per collective executed (run time)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def add(self, meta: dict[str, Any], in_shape: list[int], out_shape: list[int], values: list[int] | None) -> None:
        n_in = 1
        for d in in_shape:
            n_in *= d
        n_out = 1
        for d in out_shape:
            n_out *= d
        rec = dict(meta, worker=self.rank, step=STEP["now"], in_shape=in_shape, out_shape=out_shape,
                   in_bytes=n_in * meta["itemsize"], out_bytes=n_out * meta["itemsize"])
        if values is not None:
            rec["values"] = values
        with self._lock:
            self.records.append(rec)


def install_hooks(tf: Any, rec: Recorder) -> None:
    from tensorflow.python.distribute import cross_device_utils as cdu
    from tensorflow.python.ops import collective_ops as cops

    orig_gather = cops.all_gather_v2
    orig_reduce = cops.all_reduce_v2
    orig_ais = cdu.CollectiveReplicaLauncher.all_reduce_indexed_slices
    orig_pad = cdu._pad_util
    state: dict[str, Any] = {"sparse": None, "calls": 0}

    def emit(t: Any, out: Any, meta: dict[str, Any], with_values: bool) -> Any:
        if tf.executing_eagerly():
            rec.add(meta, list(t.shape), list(out.shape), out.numpy().tolist() if with_values else None)
            return out

        def record(in_shape: Any, out_shape: Any, *vals: Any) -> Any:
            rec.add(meta, in_shape.numpy().tolist(), out_shape.numpy().tolist(),
                    vals[0].numpy().tolist() if vals else None)
            return 0

        inputs = [tf.shape(t), tf.shape(out)] + ([out] if with_values else [])
        done = tf.py_function(record, inputs, Tout=tf.int32)
        with tf.control_dependencies([done]):
            return tf.identity(out)

    def meta_of(op: str, t: Any, stage: str, padded: bool, call: int | None) -> dict[str, Any]:
        dtype = tf.as_dtype(t.dtype)
        return {"op": op, "stage": stage, "padded": padded, "call": call, "phase": PHASE["now"],
                "dtype": dtype.name, "itemsize": dtype.size}

    def all_reduce_indexed_slices(self: Any, input_slices: Any, options: Any = None) -> Any:
        state["calls"] += 1
        prev = state["sparse"]
        state["sparse"] = {"call": state["calls"], "gathers": 0, "pad_pending": False}
        try:
            return orig_ais(self, input_slices, options)
        finally:
            state["sparse"] = prev

    def pad_util(input_tensor: Any, full_axis_dim: Any) -> Any:
        if state["sparse"] is not None:
            state["sparse"]["pad_pending"] = True
        return orig_pad(input_tensor, full_axis_dim)

    def all_gather_v2(t: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_gather(t, *args, **kwargs)
        ctx = state["sparse"]
        if ctx is None:
            return emit(t, out, meta_of("all_gather", t, "other", False, None), False)
        i = ctx["gathers"]
        ctx["gathers"] += 1
        stage = "lengths" if i == 0 else ("values" if i % 2 == 1 else "indices")
        padded, ctx["pad_pending"] = ctx["pad_pending"], False
        return emit(t, out, meta_of("all_gather", t, stage, padded, ctx["call"]), stage == "lengths")

    def all_reduce_v2(t: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_reduce(t, *args, **kwargs)
        return emit(t, out, meta_of("all_reduce", t, "dense", False, None), False)

    cops.all_gather_v2 = all_gather_v2
    cops.all_reduce_v2 = all_reduce_v2
    cdu.CollectiveReplicaLauncher.all_reduce_indexed_slices = all_reduce_indexed_slices
    cdu._pad_util = pad_util


def summarize(records: list[dict[str, Any]], n: int, densify: bool) -> list[str]:
    lines = []
    steps = sorted({r["step"] for r in records if r["step"] >= 0})
    if not densify:
        lines.append("IndexedSlices path, per step and worker (bytes received = output tensor bytes on that worker):")
        hdr = (f"{'step':>4} {'worker':>6} {'rows':>6} {'max':>6} {'sum':>6} {'padded':>6} {'lengths_B':>9} "
               f"{'values_B':>10} {'indices_B':>9} {'recv_B':>10} {'N*max*(row+idx)':>15} {'match':>5} "
               f"{'padding_B':>9} {'sent_B':>9}")
        lines.append(hdr)
        for step in steps:
            for w in range(n):
                rs = [r for r in records if r["step"] == step and r["worker"] == w and r["call"] is not None]
                for call in sorted({r["call"] for r in rs}):
                    c = {r["stage"]: r for r in rs if r["call"] == call}
                    ln, va, ix = c["lengths"], c["values"], c["indices"]
                    rows = ln["values"]
                    mx, sm = max(rows), sum(rows)
                    row_b = va["itemsize"]
                    for d in va["out_shape"][1:]:
                        row_b *= d
                    idx_b = ix["itemsize"]
                    recv = va["out_bytes"] + ix["out_bytes"]
                    formula = n * mx * (row_b + idx_b)
                    padding = (n * mx - sm) * (row_b + idx_b)
                    sent = va["in_bytes"] + ix["in_bytes"]
                    lines.append(f"{step:>4} {w:>6} {rows[w]:>6} {mx:>6} {sm:>6} {str(va['padded']):>6} "
                                 f"{ln['out_bytes']:>9} {va['out_bytes']:>10} {ix['out_bytes']:>9} {recv:>10} "
                                 f"{formula:>15} {str(recv == formula):>5} {padding:>9} {sent:>9}")
        lines.append("  row_bytes = width x itemsize; index_bytes = indices itemsize; padding = (N x max - sum) x "
                     "(row_bytes + index_bytes); sent_B = values + indices this worker put in (padded to max)")
    lines.append("Dense all-reduces, per step and worker (bytes received = output tensor bytes):")
    lines.append(f"{'step':>4} {'worker':>6} {'phase':>10} {'calls':>5} {'shapes':<28} {'recv_B':>10}")
    for step in steps:
        for w in range(n):
            for phase in ("gradients", "loss"):
                rs = [r for r in records if r["step"] == step and r["worker"] == w and r["op"] == "all_reduce"
                      and r["phase"] == phase]
                if rs:
                    shapes = ",".join("x".join(map(str, r["out_shape"])) or "scalar" for r in rs)
                    lines.append(f"{step:>4} {w:>6} {phase:>10} {len(rs):>5} {shapes:<28} "
                                 f"{sum(r['out_bytes'] for r in rs):>10}")
    return lines


def horovod_baseline(args: argparse.Namespace, comm: Any, rank: int, size: int) -> None:
    """The same lookups, the IndexedSlices gradient reduced by ``hvd.allreduce(g, op=hvd.Sum)``: two
    allgathers (values, indices) of each rank's own rows, no padding. Eager, so the received shapes are
    read directly. Needs Horovod (the main .venv, TF 2.15)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import horovod
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    rows = args.rows_base + rank * args.rows_step
    emb = tf.keras.layers.Embedding(args.vocab, args.width)
    emb.build((None,))
    ids = tf.constant(np.random.default_rng(rank).integers(0, args.vocab, rows), tf.int32)
    mine = []
    for step in range(args.steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(emb(ids)) / 4096.0
        g = tape.gradient(loss, emb.trainable_variables[0])
        assert isinstance(g, tf.IndexedSlices), type(g)
        r = hvd.allreduce(g, op=hvd.Sum)
        row_b = r.values.dtype.size * args.width
        mine.append({"step": step, "worker": rank, "rows": rows, "row_b": row_b, "idx_b": r.indices.dtype.size,
                     "values_B": int(np.prod(r.values.shape)) * r.values.dtype.size,
                     "indices_B": int(np.prod(r.indices.shape)) * r.indices.dtype.size,
                     "sent_B": rows * (row_b + g.indices.dtype.size)})
    comm.Barrier()
    everything = comm.gather(mine, root=0)
    if rank == 0:
        assert everything is not None
        recs = [r for part in everything for r in part]
        all_rows = [r["rows"] for r in recs if r["step"] == 0]
        sm, mx = sum(all_rows), max(all_rows)
        out = [f"{PROG} --horovod: TensorFlow {tf.__version__}, Horovod {horovod.__version__}, N={size}, eager, "
               f"hvd.allreduce(IndexedSlices, op=Sum)",
               f"rows per worker {all_rows}, width {args.width} float32, vocab {args.vocab}, steps {args.steps}",
               f"{'step':>4} {'worker':>6} {'rows':>6} {'sum':>6} {'values_B':>10} {'indices_B':>9} {'recv_B':>10} "
               f"{'sum*(row+idx)':>13} {'match':>5} {'N*max*(row+idx)':>15} {'sent_B':>9}"]
        for r in sorted(recs, key=lambda r: (r["step"], r["worker"])):
            recv = r["values_B"] + r["indices_B"]
            exact = sm * (r["row_b"] + r["idx_b"])
            padded = size * mx * (r["row_b"] + r["idx_b"])
            out.append(f"{r['step']:>4} {r['worker']:>6} {r['rows']:>6} {sm:>6} {r['values_B']:>10} "
                       f"{r['indices_B']:>9} {recv:>10} {exact:>13} {str(recv == exact):>5} {padded:>15} "
                       f"{r['sent_B']:>9}")
        print("\n".join(out), flush=True)
    comm.Barrier()
    hvd.shutdown()


def main(argv: list[str] | None = None) -> NoReturn:
    args = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", comm.Get_rank()))
    size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", comm.Get_size()))
    if args.horovod:
        horovod_baseline(args, comm, rank, size)
        MPI.Finalize()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    ports = comm.bcast(free_ports(size) if rank == 0 else None, root=0)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                                          "task": {"type": "worker", "index": rank}})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import numpy as np
    import tensorflow as tf  # no TF op before the strategy exists

    rec = Recorder(rank)
    install_hooks(tf, rec)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=args.timeout or None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    keras = tf.keras
    rows = args.rows_base + rank * args.rows_step
    with strategy.scope():
        emb = keras.layers.Embedding(args.vocab, args.width)
        emb.build((None,))
        head = keras.layers.Dense(1)
        head.build((None, args.width))
        tvars = list(emb.trainable_variables) + list(head.trainable_variables)
        opt = keras.optimizers.SGD(0.1)
        opt.build(tvars)
    ids = tf.constant(np.random.default_rng(rank).integers(0, args.vocab, rows), tf.int32)
    grad_types: list[str] = []

    def step_fn(ids: Any) -> Any:
        PHASE["now"] = "forward"
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(head(emb(ids))) / 4096.0
        grads = tape.gradient(loss, tvars)
        grad_types[:] = ["IndexedSlices" if isinstance(g, tf.IndexedSlices) else "Tensor" for g in grads]
        if args.densify:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        PHASE["now"] = "gradients"
        opt.apply_gradients(zip(grads, tvars))
        return loss

    def train_step(ids: Any) -> Any:
        per_replica = strategy.run(step_fn, args=(ids,))
        PHASE["now"] = "loss"
        return strategy.reduce("SUM", per_replica, axis=None)

    if not args.eager:
        train_step = tf.function(train_step)
    losses = []
    for i in range(args.steps):
        STEP["now"] = i
        losses.append(float(train_step(ids)))

    comm.Barrier()
    everything = comm.gather(rec.records, root=0)
    info = comm.gather({"rank": rank, "rows": rows, "grad_types": grad_types, "losses": losses}, root=0)
    if rank == 0:
        assert everything is not None and info is not None
        records = [r for part in everything for r in part]
        import keras as keras_package  # Keras 2.15 (tf.keras) under TF 2.15, Keras 3 under TF >= 2.16

        keras_version = keras_package.__version__
        mode = "eager" if args.eager else "tf.function"
        reduction = "densified before apply_gradients" if args.densify else "IndexedSlices as is"
        out = [f"{PROG}: TensorFlow {tf.__version__}, Keras {keras_version}, numpy {np.__version__}, N={size}, "
               f"{mode}, {reduction}",
               f"rows per worker {[d['rows'] for d in info]}, width {args.width} float32, vocab {args.vocab}, "
               f"steps {args.steps}; gradient types {info[0]['grad_types']}; losses w0 {info[0]['losses']}",
               "Every collective on worker 0, in the order its records ran (a record runs after its collective):",
               f"{'step':>4} {'op':<10} {'phase':<9} {'stage':<7} {'padded':<6} {'dtype':<7} {'in':<12} "
               f"{'out':<12} {'in_B':>9} {'out_B':>10}"]
        for r in (r for r in records if r["worker"] == 0):
            shp_in = "x".join(map(str, r["in_shape"])) or "scalar"
            shp_out = "x".join(map(str, r["out_shape"])) or "scalar"
            out.append(f"{r['step']:>4} {r['op']:<10} {r['phase']:<9} {r['stage']:<7} {str(r['padded']):<6} "
                       f"{r['dtype']:<7} {shp_in:<12} {shp_out:<12} {r['in_bytes']:>9} {r['out_bytes']:>10}")
        out += summarize(records, size, args.densify)
        print("\n".join(out), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"tf": tf.__version__, "n": size, "args": vars(args), "info": info, "records": records}, f)
    comm.Barrier()
    MPI.Finalize()  # as MPI requires of every process; then no interpreter teardown (gRPC, TF threads)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # one rank failing must not leave the others waiting in a collective or barrier
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)
