"""Prediction at larger rank counts: collective bytes per rank (exact) and peak memory (modelled).

Collective bytes follow :mod:`memdiag.formula` exactly. Peak memory is modelled as

    peak(N) = base + k x G(N)

where G(N) is the bytes each rank receives by allgather at N ranks and ``k`` what each gathered byte
costs at the peak. Horovod's sparse path with op=Average holds the gathered values twice (the
allgather output and its average, values / N, a second tensor of the same size) and the indices
once, so k = (2 x values + indices) / (values + indices), just under 2. ``base`` is anchored at the
largest rank count measured: at small N the gathered buffers partly reuse memory the allocator
already holds, so a straight fit over small N underestimates the slope (it is reported beside).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memdiag.analyze.scaling import linear_fit
from memdiag.formula import SparseGradientShape

DEFAULT_COST_PER_GATHERED_BYTE = 2.0


@dataclass
class MemoryModel:
    """What a run (or several) measured, reduced to what prediction needs."""

    tensors: dict[str, SparseGradientShape]
    dense_collective_bytes: int  # allreduce bytes per step of the always-dense gradients
    base: dict[str, float]  # per mode: peak memory that does not grow with N
    cost_per_gathered_byte: float = DEFAULT_COST_PER_GATHERED_BYTE
    fitted_from: list[int] = field(default_factory=list)
    margin: float = 1.0
    fitted_cost: float | None = None  # slope of a straight fit over the measured N, for comparison

    def gathered_bytes(self, mode: str, world_size: int) -> int:
        if world_size == 1:
            return 0  # one rank runs no collective at all
        if mode == "dense":
            return 0
        if mode == "auto":
            return sum(t.gathered(world_size) for t in self.tensors.values()
                       if t.gathered(world_size) <= self.margin * t.dense())
        return sum(t.gathered(world_size) for t in self.tensors.values())

    def collective_bytes(self, mode: str, world_size: int) -> int:
        """Bytes each rank receives per step (exact, from the formula)."""
        if world_size == 1:
            return 0
        gathered = self.gathered_bytes(mode, world_size)
        densified = sum(t.dense() for t in self.tensors.values()
                        if mode == "dense" or (mode == "auto" and t.gathered(world_size) > self.margin * t.dense()))
        return self.dense_collective_bytes + gathered + densified

    def peak(self, mode: str, world_size: int) -> float:
        base = self.base.get(mode, self.base.get("sparse"))
        if mode == "auto" and "auto" not in self.base:
            base = self.base.get("dense", base)
        return base + self.cost_per_gathered_byte * self.gathered_bytes(mode, world_size)

    def ranks_over_budget(self, mode: str, budget: float, limit: int = 1 << 20) -> int | None:
        """Smallest N whose predicted peak exceeds ``budget`` (None if none up to ``limit``)."""
        if self.peak(mode, limit) <= budget:
            return None
        low, high = 1, limit  # peak is non-decreasing in N for every mode
        if self.peak(mode, low) > budget:
            return low
        while high - low > 1:
            mid = (low + high) // 2
            if self.peak(mode, mid) > budget:
                high = mid
            else:
                low = mid
        return high


def tensors_from_summary(summary: dict[str, Any]) -> dict[str, SparseGradientShape]:
    """The IndexedSlices gradients of a run, with the sizes its policy records carry."""
    keys = ("rows_per_rank", "row_bytes", "index_bytes", "dense_rows", "row_elements")
    return {p["name"]: SparseGradientShape(**{k: p[k] for k in keys})
            for p in summary.get("policy", []) if all(p.get(k) is not None for k in keys)}


def dense_collective_bytes(summary: dict[str, Any]) -> int:
    """Per-step allreduce bytes of gradients that are dense whatever the mode."""
    return sum(c["bytes_out_per_rank"] * round(c["calls_per_step"]) for c in summary["collectives"]
               if c["op"] == "allreduce" and not c["sparse"])


def build_model(summaries: list[dict[str, Any]], margin: float = 1.0) -> MemoryModel:
    """From one run or several (a comparison): the tensors, the bases and the cost per gathered byte."""
    tensors: dict[str, SparseGradientShape] = {}
    for summary in sorted(summaries, key=lambda s: s["world_size"]):
        tensors.update(tensors_from_summary(summary))
    dense_bytes = max((dense_collective_bytes(s) for s in summaries if s["world_size"] > 1), default=0)
    probe = MemoryModel(tensors, dense_bytes, {}, margin=margin)
    cost = physical_cost(tensors)
    sparse = sorted((s for s in summaries if s["mode"] == "sparse" and s["peak_rss_bytes_max"]),
                    key=lambda s: s["world_size"])
    several = len({s["world_size"] for s in sparse if s["world_size"] > 1}) >= 2
    fitted = [s for s in sparse if s["world_size"] > 1] if several else sparse
    fit = linear_fit([probe.gathered_bytes("sparse", s["world_size"]) for s in fitted],
                     [s["peak_rss_bytes_max"] for s in fitted])
    base: dict[str, float] = {}
    if sparse:
        anchor = sparse[-1]
        base["sparse"] = anchor["peak_rss_bytes_max"] - cost * probe.gathered_bytes("sparse", anchor["world_size"])
    for mode in ("dense", "auto"):
        runs = [s for s in summaries if s["mode"] == mode and s["peak_rss_bytes_max"]]
        if any(r["world_size"] > 1 for r in runs):
            runs = [r for r in runs if r["world_size"] > 1]
        if runs:
            base[mode] = max(s["peak_rss_bytes_max"] - cost * probe.gathered_bytes(mode, s["world_size"])
                             for s in runs)
    model = MemoryModel(tensors, dense_bytes, base, cost, [s["world_size"] for s in summaries], margin)
    model.fitted_cost = None if fit is None else fit[0]
    return model


def physical_cost(tensors: dict[str, SparseGradientShape]) -> float:
    """Peak bytes per gathered byte on Horovod's averaging sparse path: values twice, indices once."""
    values = sum(t.rows_per_rank * t.row_bytes for t in tensors.values())
    indices = sum(t.rows_per_rank * t.index_bytes for t in tensors.values())
    return DEFAULT_COST_PER_GATHERED_BYTE if not values else (2 * values + indices) / (values + indices)


def prediction_table(model: MemoryModel, rank_counts: list[int], modes: list[str],
                     budget: float | None = None) -> dict[str, Any]:
    """Per rank count and mode: collective bytes and peak; per mode: where the budget is passed;
    per tensor: where its gathered count passes MPI's 32-bit limit."""
    rows = [{"world_size": n, "mode": mode, "collective_bytes_per_rank": model.collective_bytes(mode, n),
             "gathered_bytes_per_rank": model.gathered_bytes(mode, n), "peak_rss_bytes": model.peak(mode, n),
             "over_budget": None if budget is None else model.peak(mode, n) > budget}
            for n in rank_counts for mode in modes]
    return {
        "rows": rows,
        "budget_bytes": budget,
        "ranks_over_budget": {m: (None if budget is None else model.ranks_over_budget(m, budget)) for m in modes},
        "count_overflow": {name: shape.overflow_ranks() for name, shape in model.tensors.items()},
        "cost_per_gathered_byte": model.cost_per_gathered_byte,
        "fitted_cost_per_gathered_byte": model.fitted_cost,
        "base_bytes": model.base,
        "fitted_from_world_sizes": sorted(set(model.fitted_from)),
        "tensors": {name: vars(shape) for name, shape in model.tensors.items()},
    }
