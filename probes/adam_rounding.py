"""Does float rounding of the workers' gradient sums, amplified by Adam, explain the MWMS sparse run's
1.26e-5 difference in one target-embedding row (id 1498) at N=4?

A single-process replay, no MPI, Horovod or MWMS: the ``small`` Transformer built as
memdiag/workloads/transformer.py builds it (same seed, Adam, WarmupSchedule), each of N workers'
gradients computed from its own ``Batches(config, seed, rank)(step)``, and the N gradients reduced
per step in several summation orders that real engines use. Every order is its own trajectory (its
own model copy and optimizer), so a difference made at step k feeds the forward pass of step k+1, as
in the real runs. The same trajectories under plain SGD (same learning-rate schedule) separate
Adam's amplification from the rounding itself.

Trajectories (``g_i`` is worker i's gradient of its local mean loss; embeddings are IndexedSlices):

* ``exact``        every gradient summed in float64, rounded to float32, divided by N; dense apply.
* ``seq-dense``    ((g0+g1)+g2)+g3 in float32 (embeddings densified per worker first), / N; dense
                   apply (Horovod --mode dense with a sequential all-reduce).
* ``pair-dense``   (g0+g1)+(g2+g3) (recursive doubling), / N; dense apply.
* ``ring-dense``   MWMS --mode dense: loss / N per worker, gradients summed in a ring order (chunk c
                   of each flattened tensor accumulated from worker c+1 round to worker c); dense apply.
* ``seq-sparse``   Horovod sparse: embeddings gathered (all workers' rows concatenated, values / N),
                   Keras dedupes (unsorted_segment_sum) and applies the IndexedSlices (sparse Adam);
                   the other gradients as seq-dense.
* ``ring-sparse``  MWMS sparse: loss / N per worker, embeddings gathered and summed by Keras's
                   dedupe, sparse apply; the other gradients summed in the ring order.

Usage: .venv/bin/python probes/adam_rounding.py [--steps 4] [--workers 4] [--preset small]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from memdiag.launch.options import DEFAULTS  # noqa: E402
from memdiag.workloads.configs import PRESETS  # noqa: E402
from memdiag.workloads.transformer import Batches, Transformer, WarmupSchedule, _optimizer  # noqa: E402

EPSILON = 1e-9  # the workload's Adam epsilon


# -- summation orders over the N workers' float32 arrays ---------------------------------------------
def sum_exact(terms):
    return np.sum(np.stack([t.astype(np.float64) for t in terms]), axis=0).astype(np.float32)


def sum_seq(terms):
    acc = terms[0].copy()
    for t in terms[1:]:
        acc = acc + t
    return acc


def sum_pair(terms):
    level = list(terms)
    while len(level) > 1:
        nxt = [level[i] + level[i + 1] for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def sum_ring(terms):
    """Ring reduce-scatter: chunk c of the flattened tensor starts at worker c+1 and is accumulated
    round the ring, ending at worker c."""
    n = len(terms)
    flat = [t.reshape(-1) for t in terms]
    bounds = np.linspace(0, flat[0].size, n + 1).astype(int)
    out = np.empty_like(flat[0])
    for c in range(n):
        lo, hi = bounds[c], bounds[c + 1]
        acc = flat[(c + 1) % n][lo:hi].copy()
        for k in range(2, n + 1):
            acc = acc + flat[(c + k) % n][lo:hi]
        out[lo:hi] = acc
    return out.reshape(terms[0].shape)


ORDERS = {"exact": sum_exact, "seq": sum_seq, "pair": sum_pair, "ring": sum_ring}

# name: (summation order of dense gradients, embeddings "dense" or "sparse", MWMS loss scaling)
TRAJECTORIES = {
    "exact": ("exact", "dense", False),
    "seq-dense": ("seq", "dense", False),
    "pair-dense": ("pair", "dense", False),
    "ring-dense": ("ring", "dense", True),
    "seq-sparse": ("seq", "sparse", False),
    "ring-sparse": ("ring", "sparse", True),
}
# The pair whose ReLU pre-activations are compared step by step (MWMS sparse vs MWMS dense).
KINK_PAIR = (("adam", "ring-sparse"), ("adam", "ring-dense"))
# Pairs compared: (a, b, what it stands for)
PAIRS = [
    ("ring-sparse", "ring-dense", "MWMS sparse vs MWMS dense"),
    ("ring-sparse", "seq-sparse", "MWMS sparse vs Horovod sparse"),
    ("seq-sparse", "seq-dense", "Horovod sparse vs Horovod dense"),
    ("seq-dense", "ring-dense", "dense, seq vs ring order"),
    ("seq-dense", "pair-dense", "dense, seq vs pair order"),
    ("seq-dense", "exact", "dense, seq vs exact sum"),
    ("ring-sparse", "exact", "MWMS sparse vs exact sum"),
]


class Trajectory:
    def __init__(self, name, order, embed, mwms, optimizer_kind, config, init_weights, build_inputs):
        self.name, self.order, self.embed, self.mwms, self.kind = name, order, embed, mwms, optimizer_kind
        self.model = Transformer(config)
        self.model(build_inputs)
        self.model.set_weights(init_weights)
        if optimizer_kind == "adam":
            self.optimizer = _optimizer(config)
        else:
            self.optimizer = tf.keras.optimizers.SGD(WarmupSchedule(config.d_model, config.warmup_steps))
        self.optimizer.build(self.model.trainable_variables)
        # per step: reduced average gradient, sum of |terms| / N, number of terms, params before/after
        self.grad: dict[str, np.ndarray] = {}
        self.absterms: dict[str, np.ndarray] = {}
        self.count: dict[str, np.ndarray] = {}
        self.before: dict[str, np.ndarray] = {}
        self.track: list[dict[str, np.ndarray]] = []  # per step, the followed row: g, m, v, θ after
        self.history: list[list[np.ndarray]] = []  # parameters before each step (the KINK_PAIR only)

    def params(self):
        return {j: v.numpy() for j, v in enumerate(self.model.trainable_variables)}

    def velocity(self, j):
        if self.kind != "adam":
            return None
        v = self.model.trainable_variables[j]
        opt = self.optimizer
        return opt._velocities[opt._index_dict[opt._var_key(v)]].numpy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--seed", type=int, default=DEFAULTS.seed)
    ap.add_argument("--row", type=int, default=1498, help="target-embedding row to follow (default 1498)")
    ap.add_argument("--no-sgd", action="store_true", help="skip the SGD trajectories")
    ap.add_argument("--dump", default="", help="directory: save each trajectory's parameters before every step (npz)")
    ap.add_argument("--only", default="", help="comma-separated trajectories to run (default: all)")
    args = ap.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(2)

    config = PRESETS["transformer"][args.preset]
    n = args.workers
    t0 = time.time()
    batches = [Batches(config, args.seed, r) for r in range(n)]
    source, target_in, _, side = batches[0](0)

    # Initial parameters as both workload variants make them: set_random_seed, then the model.
    tf.keras.utils.set_random_seed(args.seed)
    compute = Transformer(config)
    _optimizer(config)  # created before the first call, as in the workload (draws no random numbers)
    compute((source, target_in, side))
    init = compute.get_weights()

    hvd_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    mwms_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function(autograph=False)
    def grads_hvd(source, target_in, target_out, side):
        with tf.GradientTape() as tape:
            loss = hvd_loss(target_out, compute((source, target_in, side), training=True))
        return loss, tape.gradient(loss, compute.trainable_variables)

    @tf.function(autograph=False)
    def grads_mwms(source, target_in, target_out, side):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(mwms_loss(target_out, compute((source, target_in, side), training=True)))
            scaled = loss / n
        return loss, tape.gradient(scaled, compute.trainable_variables)

    build = (source, target_in, side)
    kinds = ["adam"] + ([] if args.no_sgd else ["sgd"])
    trajs = {}
    for kind in kinds:
        for name, (order, embed, mwms) in TRAJECTORIES.items():
            if kind == "sgd" and name == "pair-dense":
                continue
            if args.only and name not in args.only.split(",") and name != "exact":
                continue
            trajs[(kind, name)] = Trajectory(name, order, embed, mwms, kind, config, init, build)
    var_names = [v.name.replace(":0", "") for v in compute.trainable_variables]
    init_train = [v.numpy().astype(np.float64) for v in compute.trainable_variables]
    target_j = [j for j, nm in enumerate(var_names) if "target_embedding" in nm][0]
    print(f"# preset {args.preset}: vocab {config.vocab_size}, embedding width {config.embedding_width}, "
          f"{config.tokens_per_rank} tokens/worker, {n} workers, {args.steps} steps, seed {args.seed}; "
          f"{len(trajs)} trajectories; setup {time.time() - t0:.1f}s", flush=True)

    # One check of the 1/N loss scaling: MWMS's gradient x N against Horovod's, same parameters.
    b = batches[0](0)
    _, gh = grads_hvd(*b)
    _, gm = grads_mwms(*b)
    worst = 0.0
    for a, m in zip(gh, gm):
        av = a.values.numpy() if isinstance(a, tf.IndexedSlices) else a.numpy()
        mv = m.values.numpy() if isinstance(m, tf.IndexedSlices) else m.numpy()
        worst = max(worst, float(np.abs(av - mv * n).max()))
    print(f"# loss scaling: max |g_hvd - {n} x g_mwms| over every gradient element, worker 0 step 0 = {worst:.3g}"
          f" ({'bitwise equal' if worst == 0 else 'NOT equal'})", flush=True)

    lr_of = WarmupSchedule(config.d_model, config.warmup_steps)
    results = []  # rows of the per-step table
    final_tables = {}
    occurrences = []
    for step in range(args.steps):
        lr = float(lr_of(step))
        data = [batches[r](step) for r in range(n)]
        row_counts = [int(np.sum(d[1] == args.row)) for d in data]
        occurrences.append(row_counts)
        for key, tr in trajs.items():
            if args.dump:
                os.makedirs(args.dump, exist_ok=True)
                np.savez(os.path.join(args.dump, f"{key[0]}-{key[1]}-step{step}.npz"),
                         *[v.numpy() for v in tr.model.trainable_variables])
            if key in KINK_PAIR:
                tr.history.append([v.numpy() for v in tr.model.trainable_variables])
            for cv, tv in zip(compute.trainable_variables, tr.model.trainable_variables):
                cv.assign(tv)
            fn = grads_mwms if tr.mwms else grads_hvd
            per = [fn(*d)[1] for d in data]
            applied = []
            for j, var in enumerate(tr.model.trainable_variables):
                name = j
                gs = [p[j] for p in per]
                if isinstance(gs[0], tf.IndexedSlices):
                    vocab = int(var.shape[0])
                    vals = [g.values.numpy() for g in gs]
                    idx = [g.indices.numpy() for g in gs]
                    cat_i = np.concatenate(idx)
                    absterm = tf.math.unsorted_segment_sum(
                        np.abs(np.concatenate(vals)).astype(np.float64), cat_i, vocab).numpy()
                    tr.count[name] = np.bincount(cat_i, minlength=vocab)
                    if tr.embed == "sparse":
                        cat_v = np.concatenate(vals)
                        if not tr.mwms:
                            cat_v = cat_v / np.float32(n)  # Horovod: gathered values / size
                        applied.append(tf.IndexedSlices(tf.constant(cat_v), tf.constant(cat_i),
                                                        tf.constant(var.shape, tf.int64)))
                        red = tf.math.unsorted_segment_sum(cat_v, cat_i, vocab).numpy()  # Keras's dedupe
                    else:
                        dense = [tf.math.unsorted_segment_sum(v, i, vocab).numpy() for v, i in zip(vals, idx)]
                        red = ORDERS[tr.order](dense)
                        if not tr.mwms:
                            red = red / np.float32(n)
                        applied.append(tf.constant(red))
                else:
                    arrs = [g.numpy() for g in gs]
                    absterm = np.sum(np.abs(np.stack(arrs)).astype(np.float64), axis=0)
                    tr.count[name] = None
                    red = ORDERS[tr.order](arrs)
                    if not tr.mwms:
                        red = red / np.float32(n)
                    applied.append(tf.constant(red))
                tr.grad[name] = red.astype(np.float32)
                tr.absterms[name] = absterm / (1.0 if tr.mwms else n)
                tr.before[name] = var.numpy()
            tr.optimizer.apply_gradients(zip(applied, tr.model.trainable_variables))
            if args.row < config.vocab_size:
                var = tr.model.trainable_variables[target_j]
                rec = dict(g=tr.grad[target_j][args.row].copy(), theta=var.numpy()[args.row].copy(),
                           absterm=tr.absterms[target_j][args.row].copy())
                if tr.kind == "adam":
                    opt = tr.optimizer
                    k = opt._index_dict[opt._var_key(var)]
                    rec["m"] = opt._momentums[k].numpy()[args.row].copy()
                    rec["v"] = opt._velocities[k].numpy()[args.row].copy()
                tr.track.append(rec)
        # compare pairs
        for kind in kinds:
            for a, b_, label in PAIRS:
                if (kind, a) not in trajs or (kind, b_) not in trajs:
                    continue
                ta, tb = trajs[(kind, a)], trajs[(kind, b_)]
                pa, pb = ta.params(), tb.params()
                per_var = []
                for name in range(len(var_names)):
                    d = np.abs(pa[name].astype(np.float64) - pb[name].astype(np.float64))
                    flat = int(np.argmax(d))
                    pos = np.unravel_index(flat, d.shape)
                    per_var.append((name, float(d.max()), pos))
                final_tables[(kind, a, b_)] = (label, per_var, pa, pb, ta, tb)
                ordered = sorted(per_var, key=lambda x: -x[1])
                shown = [ordered[0]] + [x for x in per_var if x[0] == target_j and x is not ordered[0]]
                for name, dmax, pos in shown:
                    results.append(detail(step, kind, label, name, var_names[name], dmax, pos, pa, pb, ta, tb, lr))
        print(f"# step {step} done ({time.time() - t0:.0f}s); lr {lr:.4g}; row {args.row} in target_in "
              f"per worker: {row_counts}", flush=True)

    print_table(results)
    # The full per-variable table after the last step, for the engine-analogue pairs.
    for kind in kinds:
        for a, b_, _label in PAIRS[:3] if kind == "adam" else PAIRS[:1]:
            if (kind, a, b_) not in final_tables:
                continue
            lab, per_var, pa, pb, ta, tb = final_tables[(kind, a, b_)]
            print(f"\n## after step {args.steps - 1}, {kind}: {lab} ({a} vs {b_}), every variable")
            print(f"{'variable':58s} {'max|dθ|':>10s} {'at':>12s} {'max|θ-θ0|':>10s} {'allowance':>10s} {'pass':>5s}")
            for name, dmax, pos in per_var:
                upd = float(np.abs(pa[name].astype(np.float64) - init_train[name]).max())
                terms = n * config.tokens_per_rank if "embedding" in var_names[name] else n
                allowance = update_allowance(max(terms, n)) * upd
                tol_ok = bool(np.all(np.abs(pa[name].astype(np.float64) - pb[name]) <=
                                     1e-6 + 1e-4 * np.abs(pa[name].astype(np.float64)) + allowance))
                print(f"{var_names[name][-58:]:58s} {dmax:10.3g} {str(tuple(int(p) for p in pos)):>12s} {upd:10.3g} "
                      f"{allowance:10.3g} {'ok' if tol_ok else 'FAIL':>5s}")
    # Row-level view of the followed row, every trajectory, after the last step
    if args.row >= config.vocab_size:
        print(f"\n# total {time.time() - t0:.0f}s")
        return 0
    print(f"\n## target_embedding row {args.row} after step {args.steps - 1}: occurrences in target_in per step "
          f"(workers 0..{n - 1}): {occurrences}")
    print(f"{'opt':4s} {'trajectory':12s} {'max|θ_row-θ_row(exact)|':>24s} {'|g_row|max(last)':>17s} "
          f"{'sqrt(v)max':>10s} {'sqrt(v)min':>10s}")
    for (kind, name), tr in trajs.items():
        ref = trajs[(kind, "exact")]
        tname = target_j
        d = np.abs(tr.params()[tname][args.row].astype(np.float64) - ref.params()[tname][args.row]).max()
        v = tr.velocity(tname)
        sv = "" if v is None else f"{np.sqrt(v[args.row]).max():10.3g} {np.sqrt(v[args.row]).min():10.3g}"
        print(f"{kind:4s} {name:12s} {d:24.3g} {np.abs(tr.grad[tname][args.row]).max():17.3g} {sv}")
    print_row_history(trajs, args.row, args.steps, lr_of)
    if all(k in trajs for k in KINK_PAIR):
        print_relu_flips(compute, trajs, batches, args.row, args.steps, n)
    print(f"\n# total {time.time() - t0:.0f}s")
    return 0


def ffn_preactivations(model, data):
    """The encoder's and decoder's FFN ReLU inputs, [tokens, filter] each, recomputed layer by layer
    as Transformer.call computes them (training=True has no dropout here)."""
    source, target_in, _, side = data
    x = model.source_embedding(source)
    if model.source_projection is not None:
        x = model.source_projection(x)
    x = x * model.scale + model.positions
    out = {}
    for i, layer in enumerate(model.encoder):
        h = layer.norm(x + layer.attention(x, x))
        flat = tf.reshape(h, [-1, h.shape[-1]])
        out[f"encoder_{i}"] = (tf.matmul(flat, layer.ffn.inner.kernel) + layer.ffn.inner.bias).numpy()
        x = layer.ffn(h)
    y = model.target_embedding(target_in)
    if model.target_projection is not None:
        y = model.target_projection(y)
    y = y * model.scale + model.positions
    for i, layer in enumerate(model.decoder):
        y1 = layer.norm1(y + layer.self_attention(y, y, use_causal_mask=True))
        y2 = layer.norm2(y1 + layer.cross_attention(y1, x))
        flat = tf.reshape(y2, [-1, y2.shape[-1]])
        out[f"decoder_{i}"] = (tf.matmul(flat, layer.ffn.inner.kernel) + layer.ffn.inner.bias).numpy()
        y = layer.ffn(y2)
    return out


def print_relu_flips(compute, trajs, batches, row, steps, n):
    """Step by step, the FFN ReLU units whose input has opposite signs in the two trajectories (a
    kink crossed: the gradient through that unit switches on or off), and whose token they sit on."""
    a, b = (trajs[k] for k in KINK_PAIR)
    print(f"\n## ReLU inputs of opposite sign, {a.name} vs {b.name} parameters before each step "
          f"(every worker's batch; 'target id' = the target_in token at that position)")
    print(f"{'st':>2s} {'worker':>6s} {'layer':10s} {'flips':>5s} {'position':>8s} {'unit':>4s} {'target id':>9s} "
          f"{'input a':>11s} {'input b':>11s}")
    for step in range(steps):
        total = 0
        for r in range(n):
            data = batches[r](step)
            pre = []
            for tr in (a, b):
                for cv, p in zip(compute.trainable_variables, tr.history[step]):
                    cv.assign(p)
                pre.append(ffn_preactivations(compute, data))
            ids = data[1].reshape(-1)
            for layer in pre[0]:
                pa, pb = pre[0][layer], pre[1][layer]
                flips = np.argwhere((pa > 0) != (pb > 0))
                total += len(flips)
                for pos, unit in flips[:5]:
                    mark = "  <- row" if ids[pos] == row else ""
                    print(f"{step:2d} {r:6d} {layer:10s} {len(flips):5d} {pos:8d} {unit:4d} {ids[pos]:9d} "
                          f"{pa[pos, unit]:11.3g} {pb[pos, unit]:11.3g}{mark}")
        print(f"{step:2d}  all   {'(total)':10s} {total:5d}")


def print_row_history(trajs, row, steps, lr_of):
    """Step by step, the followed row's element where the Adam trajectories end furthest apart."""
    adam = {name: tr for (kind, name), tr in trajs.items() if kind == "adam"}
    finals = np.stack([tr.track[-1]["theta"] for tr in adam.values()])
    col = int(np.argmax(finals.max(axis=0) - finals.min(axis=0)))
    print(f"\n## target_embedding[{row}, {col}] (the element where the Adam trajectories end furthest apart), "
          f"step by step")
    print("# row: max|g_row| over the row's 1024 elements, and max|g_row - g_row(exact)| (the whole row's gradient)")
    print(f"{'st':>2s} {'opt':4s} {'trajectory':12s} {'g':>11s} {'Σ|t|':>10s} {'m':>11s} {'sqrt(v)':>10s} "
          f"{'sqrtv/eps':>9s} {'m/(sqrtv+eps)':>13s} {'θ':>13s} {'θ-θ(exact)':>11s} {'row max|g|':>10s} "
          f"{'row max|dg|':>11s}")
    for step in range(steps):
        for (kind, name), tr in trajs.items():
            r = tr.track[step]
            ref = trajs[(kind, "exact")].track[step]
            if kind == "adam":
                sv = math.sqrt(float(r["v"][col]))
                extra = (f"{float(r['m'][col]):11.3g} {sv:10.3g} {sv / EPSILON:9.3g} "
                         f"{float(r['m'][col]) / (sv + EPSILON):13.4g}")
            else:
                extra = f"{'-':>11s} {'-':>10s} {'-':>9s} {'-':>13s}"
            print(f"{step:2d} {kind:4s} {name:12s} {float(r['g'][col]):11.4g} {float(r['absterm'][col]):10.3g} "
                  f"{extra} {float(r['theta'][col]):13.8g} {float(r['theta'][col]) - float(ref['theta'][col]):11.3g} "
                  f"{float(np.abs(r['g']).max()):10.3g} {float(np.abs(r['g'] - ref['g']).max()):11.3g}")


def update_allowance(terms: int) -> float:
    u = 2.0**-24
    if terms * u >= 0.5:
        return 1.0
    return min(1.0, 2 * terms * u / (1 - terms * u))


def detail(step, kind, label, name, short, dmax, pos, pa, pb, ta, tb, lr):
    """The figures at the element where the pair differs most in ``name``."""
    ga, gb = float(ta.grad[name][pos]), float(tb.grad[name][pos])
    absterm = float(ta.absterms[name][pos])
    cnt = ta.count[name]
    terms = int(cnt[pos[0]]) if cnt is not None else None
    ua = abs(float(pa[name][pos]) - float(ta.before[name][pos]))
    ub = abs(float(pb[name][pos]) - float(tb.before[name][pos]))
    va = ta.velocity(name)
    sqrt_v = None if va is None else math.sqrt(float(va[pos]))
    row = int(pos[0]) if len(pos) > 1 or cnt is not None else None
    return dict(step=step, kind=kind, pair=label, var=short, dmax=dmax, pos=tuple(int(p) for p in pos), row=row,
                ga=ga, gb=gb, dg=abs(ga - gb), absterm=absterm, terms=terms,
                cancel=(absterm / abs(ga) if ga else float("inf")), sqrt_v=sqrt_v,
                ua=ua / lr, ub=ub / lr, lr=lr, dlr=dmax / lr)


def print_table(rows):
    print("\n## per step: for each pair, the variable differing most and the target embedding, at the element "
          "of the largest |dθ|")
    print("# g = reduced (averaged) gradient of that element in each trajectory; Σ|t| = sum of the magnitudes "
          "of its terms (every looked-up row, or every worker) / N; Σ|t|/|g| = cancellation; "
          "upd/lr = |θ step change| / learning rate")
    head = (f"{'st':>2s} {'opt':4s} {'pair':32s} {'variable':44s} {'max|dθ|':>9s} {'dθ/lr':>8s} {'at':>12s} "
            f"{'g_a':>10s} {'g_b':>10s} {'|dg|':>9s} {'Σ|t|':>9s} {'n_t':>6s} {'Σ|t|/|g|':>9s} "
            f"{'sqrt(v)':>9s} {'sqrtv/eps':>9s} {'upd/lr a':>8s} {'upd/lr b':>8s}")
    print(head)
    print("-" * len(head))
    for r in rows:
        sv = "-" if r["sqrt_v"] is None else f"{r['sqrt_v']:9.3g}"
        se = "-" if r["sqrt_v"] is None else f"{r['sqrt_v'] / EPSILON:9.3g}"
        nt = "-" if r["terms"] is None else str(r["terms"])
        print(f"{r['step']:2d} {r['kind']:4s} {r['pair'][:32]:32s} {r['var'][-44:]:44s} {r['dmax']:9.3g} "
              f"{r['dlr']:8.3g} {str(r['pos']):>12s} {r['ga']:10.3g} {r['gb']:10.3g} {r['dg']:9.2g} "
              f"{r['absterm']:9.3g} {nt:>6s} {r['cancel']:9.3g} {sv:>9s} {se:>9s} {r['ua']:8.3g} {r['ub']:8.3g}")


if __name__ == "__main__":
    sys.exit(main())
