"""Scaling efficiency, measured and projected to rank counts this machine cannot run.

The projection is an alpha-beta model of ring collectives (latency ``alpha`` per step of the ring,
bandwidth ``beta`` bytes/s per link) applied to the message sizes a real run recorded:

    ring allreduce of S bytes             2(n-1) alpha + 2(n-1)/n x S / beta
    ring allgather of s bytes per rank     (n-1) alpha +  (n-1)/n x n s / beta

Communication is assumed NOT to overlap compute: projected step time = compute + communication.
That is pessimistic for dense gradients (Horovod reduces early layers while later ones are still
being differentiated) and it is what makes the figures comparable across modes.

Byte sizes of IndexedSlices gradients come from :mod:`memdiag.formula` (the one place they are
defined): sparse mode gathers ``gathered_bytes`` per rank, dense mode allreduces ``dense_bytes``; the
shapes come from the run's policy records and, where those lacked them, its other records, read as
:mod:`memdiag.analyze.model` reads them (each rank as the largest rank measured); a gradient the model
names as not predictable is refused here with the model's reason.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from memdiag._errors import UserError
from memdiag.analyze.model import gradients_from_summaries
from memdiag.format.results import RunSummary
from memdiag.formula import MPI_COUNT_LIMIT, SparseGradientShape, gathered_elements

# Typical of a 100 Gb/s fabric (InfiniBand EDR, Omni-Path as on Stampede2): a few microseconds of
# MPI latency and about 10 GB/s of the 12.5 GB/s line rate achieved per link.
DEFAULT_ALPHA_S = 5e-6
DEFAULT_BETA_BYTES_PER_S = 10e9
# Horovod packs ready tensors into one fusion buffer per allreduce (HOROVOD_FUSION_THRESHOLD). Its
# default in Horovod 0.28.1 is 128 MiB: horovod/common/operations.cc, BackgroundThreadLoop(), line 519:
# `state.parameter_manager.SetTensorFusionThresholdBytes(128 * 1024 * 1024);` before the variable is read.
DEFAULT_FUSION_BYTES = 128 * 1024**2

PROJECTED_MODES = ("sparse", "dense")
NO_POLICY = "no policy record names it (memdiag did not see it reduced as a gradient), so its sizes are unknown"
SCALINGS = ("weak", "strong")

ASSUMPTIONS = (
    "ring allreduce 2(n-1)a + 2(n-1)/n S/b; ring allgather (n-1)a + (n-1)/n n s/b",
    "no overlap of communication with compute: step = compute + communication",
    "dense gradients fused into Horovod buffers of the fusion threshold (latency paid per buffer)",
    "sparse mode: each IndexedSlices gradient is two allgathers (values, indices); dense mode: "
    "one allreduce of dense_rows x row_bytes",
    "compute time per step proportional to the per-rank batch; IndexedSlices rows per rank too",
    "weak scaling: efficiency against 1 rank (no communication); strong scaling: global batch of "
    "the smallest projected N at the measured per-rank batch, efficiency against that N",
    "one rank per network link; no contention, stragglers or negotiation time",
)


@dataclass(frozen=True)
class Network:
    """The alpha-beta model of one link."""

    alpha_s: float
    beta_bytes_per_s: float
    source: str  # "default", "command line" or the probe file the figures were fitted from


def ring_allreduce_s(n: int, size_bytes: float, net: Network) -> float:
    """Seconds for a ring allreduce of ``size_bytes`` over ``n`` ranks."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * net.alpha_s + 2 * (n - 1) / n * size_bytes / net.beta_bytes_per_s


def ring_allgather_s(n: int, per_rank_bytes: float, net: Network, messages: int = 1) -> float:
    """Seconds for ``messages`` ring allgathers whose per-rank inputs add up to ``per_rank_bytes``."""
    if n <= 1:
        return 0.0
    return messages * (n - 1) * net.alpha_s + (n - 1) / n * (n * per_rank_bytes) / net.beta_bytes_per_s


def speedup(throughput: float, base_throughput: float) -> float:
    return throughput / base_throughput


def scaling_efficiency(throughput: float, world_size: int, base_throughput: float, base_world_size: int) -> float:
    """Efficiency of ``world_size`` ranks against ``base_world_size`` ranks, from throughputs.

    Weak scaling's per-rank throughput ratio, (X/N) / (X0/N0), and strong scaling's speedup over
    the rank ratio, (X/X0) / (N/N0), are the same number; what differs between the two is the work
    each rank was given (fixed per rank, or a fixed total divided among the ranks).
    """
    return speedup(throughput, base_throughput) / (world_size / base_world_size)


def fuse(sizes: list[int], threshold: int) -> list[int]:
    """Allreduce message sizes after Horovod-style fusion: tensors packed in order up to ``threshold``."""
    messages: list[int] = []
    current = 0
    for size in sizes:
        if current and current + size > threshold:
            messages.append(current)
            current = 0
        current += size
    if current:
        messages.append(current)
    return messages


# -- network from the collective probe ------------------------------------------------------------

def fit_network(rows: list[dict[str, Any]], source: str) -> Network:
    """Fit alpha and beta to ``probes/collective_bench.py --json`` rows (relative least squares).

    Each row gives one equation  time = x alpha + y / beta  with, for n ranks,
    allreduce: x = 2(n-1), y = 2(n-1)/n x bytes_in;  allgather: x = n-1, y = (n-1)/n x bytes_out.
    """
    equations = []
    for row in rows:
        n, op, seconds = int(row["world_size"]), row["op"], float(row["time_us"]) * 1e-6
        if n < 2 or seconds <= 0:
            continue
        if op == "allreduce":
            equations.append((2 * (n - 1), 2 * (n - 1) / n * float(row["bytes_in"]), seconds))
        elif op == "allgather":
            equations.append((n - 1, (n - 1) / n * float(row["bytes_out"]), seconds))
    # Relative errors: small messages (latency) count as much as large ones (bandwidth).
    a = np.array([[x / t, y / t] for x, y, t in equations]).reshape(-1, 2)
    b = np.ones(len(equations))
    if len(equations) < 2 or np.linalg.matrix_rank(a) < 2:
        raise UserError(f"{source}: need allreduce/allgather rows of at least two sizes on 2 or more ranks; "
                        "run e.g. mpirun -np 2 python probes/collective_bench.py --sizes 1K,1M,16M --json FILE")
    alpha, inverse_beta = np.linalg.lstsq(a, b, rcond=None)[0]
    if alpha < 0:  # latency lost in the noise of a fast link: fit bandwidth alone
        alpha, inverse_beta = 0.0, float(np.linalg.lstsq(a[:, 1:], b, rcond=None)[0][0])
    if inverse_beta <= 0:
        raise UserError(f"{source}: the timings do not grow with the message size, so no bandwidth can be "
                        "fitted; rerun the probe with larger sizes (e.g. --sizes 1M,16M,64M)")
    return Network(float(alpha), 1.0 / float(inverse_beta), source)


def load_network(path: str) -> Network:
    try:
        with open(path, encoding="utf-8") as f:
            rows = json.load(f)
    except OSError as exc:
        raise UserError(f"--network {path}: cannot read it ({exc.strerror}); give the file written by "
                        "probes/collective_bench.py --json") from None
    except ValueError:
        raise UserError(f"--network {path} is not JSON; give the file written by probes/collective_bench.py --json") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and {"world_size", "op", "bytes_in", "bytes_out",
                                                                     "time_us"} <= set(r) for r in rows):
        raise UserError(f"--network {path}: expected the row list of probes/collective_bench.py --json")
    return fit_network(rows, path)


# -- what a run tells the projection ---------------------------------------------------------------

@dataclass(frozen=True)
class ProjectionBase:
    """One measured run reduced to what the model needs."""

    run_dir: str
    world_size: int
    items_per_rank: float
    compute_s: float  # per step, at items_per_rank
    dense_allreduce_bytes: tuple[int, ...]  # each dense gradient's allreduce input, per step
    sparse: dict[str, SparseGradientShape]  # the IndexedSlices gradients, by name


def base_from_summary(summary: RunSummary, run_dir: str, items_per_rank: float, compute_s: float,
                      parameter_bytes: dict[str, int] | None = None) -> ProjectionBase:
    """Message sizes of a run, whatever its mode. IndexedSlices gradients come from the policy records,
    which carry their shape in the byte formula. Dense gradients come from the allreduces the run
    recorded or, for one rank (where Horovod runs no collective), from ``parameter_bytes``: the size of
    every trainable variable, all of which but the IndexedSlices ones would be allreduced."""
    # The model's reading of the same records (rows from the run where the trace lacked them, the
    # largest rank's): a gradient it names as not predictable cannot be projected either, for the same reason.
    sparse, not_predicted = gradients_from_summaries([summary])
    collectives = summary["collectives"]
    if (summary.get("world_size") or 0) >= 2:
        dense = tuple(c["bytes_in_per_rank"] for c in collectives if c["op"] == "allreduce" and not c["sparse"]
                      for _ in range(max(1, round(c["calls_per_step"]))))
        seen = {c["name"] for c in collectives if c["sparse"]} | set(not_predicted)
        unknown = {name: not_predicted.get(name, NO_POLICY) for name in sorted(seen - set(sparse))}
    elif parameter_bytes is not None:
        dense = tuple(size for name, size in parameter_bytes.items() if name not in sparse)
        unknown = {name: not_predicted.get(name, NO_POLICY) for name in
                   sorted(p["name"] for p in summary.get("policy", []) if p["name"] not in sparse)}
    else:
        raise UserError("projection needs a run on 2 or more ranks, or a one-rank run of a built-in workload "
                        "(its saved parameters give the sizes Horovod skips on 1 rank)")
    if unknown:
        name, why = next(iter(unknown.items()))
        raise UserError(f"{name}: this IndexedSlices gradient cannot be projected: {why}")
    return ProjectionBase(run_dir, summary["world_size"], items_per_rank, compute_s, dense, sparse)


# -- projection ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepCost:
    """One projected step on one rank."""

    compute_s: float
    communication_s: float
    collective_bytes_per_rank: int  # outputs received per rank per step
    gathered_bytes_per_rank: int  # of which allgather outputs (sparse mode)
    exceeds_mpi_count: bool  # a gathered buffer holds more elements than MPI's 32-bit counts

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s


@dataclass(frozen=True)
class ProjectedPoint:
    scaling: str
    mode: str
    world_size: int
    items_per_rank: float
    efficiency: float
    cost: StepCost


def _scaled_rows(shape: SparseGradientShape, ratio: float) -> SparseGradientShape:
    """The same gradient at another per-rank batch: one row per looked-up item, so rows scale with it."""
    return replace(shape, rows_per_rank=max(1, round(shape.rows_per_rank * ratio)))


def at_batch(base: ProjectionBase, items_per_rank: float) -> ProjectionBase:
    """The measured run as if it had run ``items_per_rank`` per rank: compute time and IndexedSlices
    rows scale with the batch, dense gradients keep their size."""
    ratio = items_per_rank / base.items_per_rank
    return replace(base, items_per_rank=items_per_rank, compute_s=base.compute_s * ratio,
                   sparse={name: _scaled_rows(shape, ratio) for name, shape in base.sparse.items()})


def step_cost(base: ProjectionBase, world_size: int, mode: str, items_per_rank: float, net: Network,
              fusion_bytes: int) -> StepCost:
    """Compute, communication and bytes of one step at ``world_size`` ranks and ``items_per_rank``."""
    if mode not in PROJECTED_MODES:
        raise ValueError(f"unknown mode {mode!r}")
    scaled = at_batch(base, items_per_rank)
    allreduce_sizes = list(scaled.dense_allreduce_bytes)
    gather_s, gathered, over_limit = 0.0, 0, False
    for shape in scaled.sparse.values():
        if mode == "dense":
            allreduce_sizes.append(shape.dense())
            continue
        # Values and indices: two allgathers whose per-rank inputs add up to gathered(1).
        gather_s += ring_allgather_s(world_size, shape.gathered(1), net, messages=2)
        gathered += shape.gathered(world_size)
        over_limit |= gathered_elements(world_size, shape.rows_per_rank, shape.row_elements) > MPI_COUNT_LIMIT
    reduce_s = sum(ring_allreduce_s(world_size, size, net) for size in fuse(allreduce_sizes, fusion_bytes))
    return StepCost(scaled.compute_s, reduce_s + gather_s, sum(allreduce_sizes) + gathered, gathered, over_limit)


def project(base: ProjectionBase, rank_counts: list[int], net: Network, fusion_bytes: int) -> list[ProjectedPoint]:
    """Weak and strong scaling efficiency in sparse and dense mode at each rank count.

    Weak: the measured per-rank batch at every N, against one rank. Strong: the global batch of the
    smallest N (at the measured per-rank batch) divided among N ranks, against that smallest N.
    """
    if not rank_counts:
        return []
    strong_n = min(rank_counts)
    global_items = strong_n * base.items_per_rank
    points = []
    for mode in PROJECTED_MODES:
        # (rank count, throughput) that each kind of scaling is measured against
        baselines = {
            "weak": (1, base.items_per_rank / step_cost(base, 1, mode, base.items_per_rank, net, fusion_bytes).step_s),
            "strong": (strong_n, global_items / step_cost(base, strong_n, mode, base.items_per_rank, net,
                                                          fusion_bytes).step_s),
        }
        for scaling in SCALINGS:
            base_n, base_throughput = baselines[scaling]
            for n in rank_counts:
                items = base.items_per_rank if scaling == "weak" else global_items / n
                cost = step_cost(base, n, mode, items, net, fusion_bytes)
                efficiency = scaling_efficiency(n * items / cost.step_s, n, base_throughput, base_n)
                points.append(ProjectedPoint(scaling, mode, n, items, efficiency, cost))
    return points


# -- published figures to compare with -------------------------------------------------------------

@dataclass(frozen=True)
class Reference:
    scaling: str
    world_size: int | None  # None: the source gives no single rank count
    efficiency: float
    text: str


REFERENCES: dict[str, tuple[Reference, ...]] = {
    "transformer": (
        Reference("weak", 1200, 0.91, "Transformer NMT, Stampede2 CPUs, densified: 91% weak at 1200 processes"),
        Reference("strong", 400, 0.65, "Transformer NMT, Stampede2 CPUs, densified: 65% strong at 400 processes"),
    ),
    "resnet50": (
        Reference("weak", None, 0.90, "ResNet-50 large-minibatch SGD on CPUs: above 90% up to 104K cores"),
    ),
}


def projection_result(base: ProjectionBase, workload: str | None, rank_counts: list[int], net: Network,
                      fusion_bytes: int) -> dict[str, Any]:
    """The projection as plain data for scale.json and the report."""
    points = project(base, rank_counts, net, fusion_bytes)
    references = REFERENCES.get(workload or "", ())
    return {
        "network": asdict(net),
        "fusion_bytes": fusion_bytes,
        "base": {
            "run_dir": base.run_dir,
            "world_size": base.world_size,
            "items_per_rank": base.items_per_rank,
            "compute_s": base.compute_s,
            "dense_allreduce_bytes": sum(base.dense_allreduce_bytes),
            "dense_tensors": len(base.dense_allreduce_bytes),
            "sparse": [{"name": name, **asdict(shape)} for name, shape in sorted(base.sparse.items())],
        },
        "strong_base_world_size": min(rank_counts),
        "assumptions": list(ASSUMPTIONS),
        "points": [{**asdict(p), "step_s": p.cost.step_s} for p in points],
        "rows": _rows_by_world_size(points, references),
        "references": [asdict(r) for r in references],
    }


def _rows_by_world_size(points: list[ProjectedPoint], references: tuple[Reference, ...]) -> list[dict[str, Any]]:
    """One table row per rank count: the four efficiencies side by side, with the published figure
    for that rank count where there is one."""
    rows: dict[int, dict[str, Any]] = {}
    for p in points:
        row = rows.setdefault(p.world_size, {"world_size": p.world_size, "references": [
            asdict(r) for r in references if r.world_size == p.world_size]})
        row[f"{p.scaling}_{p.mode}_efficiency"] = p.efficiency
        if p.scaling == "weak":
            row[f"{p.mode}_communication_s"] = p.cost.communication_s
            row[f"{p.mode}_collective_bytes_per_rank"] = p.cost.collective_bytes_per_rank
            if p.mode == "sparse":
                row["gathered_bytes_per_rank"] = p.cost.gathered_bytes_per_rank
                row["exceeds_mpi_count"] = p.cost.exceeds_mpi_count
            row["compute_s"] = p.cost.compute_s
    return [rows[n] for n in sorted(rows)]

