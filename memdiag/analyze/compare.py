"""The comparison of modes across rank counts: table rows, growth per added rank, correctness, verdict.

With two engines (``memdiag compare --engine both``) each engine's runs make the comparison above on
their own (:func:`build`), and :func:`build_engines` sets them side by side: per rank count, engine and
mode the steady peak, the bytes gathered and all-reduced, MultiWorkerMirroredStrategy's padding, and
what the formula (:mod:`memdiag.formula`) predicted from every rank's own rows in; a verdict
across the engines; and the final parameters of each engine against the first engine's (the
reference, Horovod) at the same rank count and mode. Engines are told apart by the data: an engine
pads its gathers when its policy records carry every worker's rows (``rows_per_worker``).
"""

from __future__ import annotations

import math
import os
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from memdiag import formula, rundir
from memdiag._errors import UserError
from memdiag.analyze import verify
from memdiag.analyze.model import linear_fit
from memdiag.schema import (
    CompareRow,
    Comparison,
    Correctness,
    CrossEngineCheck,
    EnginePeak,
    EngineRow,
    EnginesComparison,
    EnginesVerdict,
    GrowthSegment,
    GrowthTensor,
    ParameterCheck,
    Physics,
    PolicySummary,
    RankOrderLook,
    ReductionCheckRecord,
    ReductionFigures,
    ReductionResult,
    RunSummary,
    SpreadCheck,
    VariableCheck,
)


def load_summary(run_dir: str) -> RunSummary:
    return rundir.read_summary(run_dir)


def table_row(summary: RunSummary, run_dir: str) -> CompareRow:
    ranks = summary["ranks"]
    step_times = [r["step_time_s"] for r in ranks if r["step_time_s"] is not None]
    return {
        "world_size": summary["world_size"],
        "mode": summary["mode"],
        "status": summary["status"],
        # Steady-state figures where the run has them (docs/explanation/measurement.md); the first step's apart.
        "steady_peak_rss_bytes_median": summary.get("steady_peak_rss_bytes_max") or summary["peak_rss_bytes_max"],
        "first_step_peak_rss_bytes": summary.get("first_step_peak_rss_bytes_max"),
        "steady": summary.get("steady"),
        "peak_phase": summary.get("peak_phase"),
        "compute_peak_rss_bytes": summary.get("compute_peak_rss_bytes_max"),
        "collective_peak_rss_bytes": summary.get("collective_peak_rss_bytes_max"),
        "collective_live_peak_bytes": summary.get("collective_live_peak_bytes_max"),
        "collective_bytes_per_rank": max((r["collective_bytes_per_step"] for r in ranks), default=0),
        "allgather_bytes_per_rank": max((r["allgather_bytes_per_step"] for r in ranks), default=0),
        "allreduce_bytes_per_rank": max((r["allreduce_bytes_per_step"] for r in ranks), default=0),
        "step_time_s": max(step_times) if step_times else None,
        "throughput_items_per_s": summary.get("throughput_items_per_s"),
        "run_dir": os.path.basename(run_dir),
        "failure": summary.get("failure"),
    }


def growth(rows: Sequence[Mapping[str, Any]], key: str, min_world_size: int = 1) -> dict[str, float | None]:
    """Per mode: the fitted increase of ``key`` per added rank, over rows with N >= min_world_size."""
    by_mode: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["world_size"] >= min_world_size:
            by_mode[row["mode"]].append(row)
    result = {}
    for mode, mode_rows in by_mode.items():
        fit = linear_fit([r["world_size"] for r in mode_rows], [r[key] for r in mode_rows])
        result[mode] = None if fit is None else fit[0]
    return result


def predicted_growth(summaries: dict[tuple[int, str], RunSummary], min_world_size: int = 1) -> int | None:
    """Bytes each added rank adds to every rank's allgather output by the formula, fitted per added rank
    as the measured growth is (over the sparse runs of N >= ``min_world_size``): at each N the formula
    with the rows that run gathered, the sum over its ranks of each rank's own rows (allgatherv gathers
    them all), so ranks with different rows count as they are. One rank gathers nothing (Horovod runs no
    collective for it), so N=1 is no point of the formula's line: with one run of N >= 2, the growth is
    its formula bytes over its N (the mean rows per rank).

    The rows are each rank's own rows in (read from its graph when traced, else from its records),
    never the gathered bytes out: an independent prediction, not the measured bytes restated.
    """
    points = sorted((n, predicted_gathered(s, n)) for (n, mode), s in summaries.items()
                    if mode == "sparse" and n >= max(min_world_size, 2))
    known = [(n, g) for n, g in points if g is not None]
    if not known:
        return None
    fit = linear_fit([float(n) for n, _ in known], [float(g) for _, g in known])
    if fit is None:
        n, gathered = max(known)
        return round(gathered / n)
    return round(fit[0])


def growth_tensors(summaries: dict[tuple[int, str], RunSummary], min_world_size: int = 1) -> list[GrowthTensor]:
    """The IndexedSlices gradients that were gathered, with what auto chose for each and why. A tensor's
    growth per added rank is its gathered bytes (from the records) fitted over the sparse runs of
    N >= ``min_world_size`` and N >= 2 as the formula's are (:func:`predicted_growth`); with one run, its
    bytes over N."""
    sparse = [(n, s) for (n, mode), s in summaries.items() if mode == "sparse" and n > 1]
    autos = [(n, s) for (n, mode), s in summaries.items() if mode == "auto"]
    auto_policy = {}
    if autos:
        _, auto_summary = max(autos, key=lambda item: item[0])
        auto_policy = {p["name"]: p for p in auto_summary.get("policy", [])}
        auto_n = max(n for n, _ in autos)
    tensors: dict[str, GrowthTensor] = {}
    if sparse:
        n, summary = max(sparse, key=lambda item: item[0])
        # as the formula's line: one rank gathers nothing (no collective), so N=1 is not on it
        by_n = {m: _gathered_by_tensor(s) for (m, mode), s in summaries.items()
                if mode == "sparse" and m >= max(min_world_size, 2)}
        for name, gathered in _gathered_by_tensor(summary).items():
            points = sorted((m, found.get(name, 0)) for m, found in by_n.items())
            fit = linear_fit([float(m) for m, _ in points], [float(g) for _, g in points])
            tensors[name] = {"name": name, "growth_bytes_per_rank": round(gathered / n) if fit is None else round(fit[0]),
                             "gathered_bytes": gathered, "at_world_size": n}
    for name, policy in auto_policy.items():
        entry = tensors.setdefault(name, {"name": name, "growth_bytes_per_rank": None,
                                          "gathered_bytes": None, "at_world_size": None})
        entry["auto_decision"] = policy["decision"]
        entry["auto_reason"] = policy["reason"]
        entry["auto_world_size"] = auto_n
        if policy.get("optimizer_input"):
            entry["auto_optimizer_input"] = policy["optimizer_input"]
    _add_merging(tensors, summaries)
    return sorted(tensors.values(), key=lambda t: -(t["growth_bytes_per_rank"] or 0))


def _gathered_by_tensor(summary: RunSummary) -> dict[str, int]:
    """Per IndexedSlices gradient, the bytes one rank received by allgather per call (values and indices),
    from the records; none at one rank."""
    found: dict[str, int] = defaultdict(int)
    for c in summary.get("collectives", []):
        if c["op"] == "allgather" and c["sparse"] and summary.get("world_size", 2) > 1:
            found[c["name"]] += c["bytes_out_per_rank"]
    return dict(found)


def _add_merging(tensors: dict[str, GrowthTensor], summaries: dict[tuple[int, str], RunSummary]) -> None:
    """What merging did to each gathered tensor, from the dedup run at the largest rank count: the
    distinct rows U against the rows T per rank, the bytes gathered merged and unmerged at that N, and
    what the merge cost in compute per step."""
    deduped = [(n, s) for (n, mode), s in summaries.items() if mode == "dedup" and n > 1]
    if not deduped:
        return
    n, summary = max(deduped, key=lambda item: item[0])
    sparse = summaries.get((n, "sparse"))
    for d in summary.get("distinct_rows", []):
        entry = tensors.setdefault(d["name"], {"name": d["name"], "growth_bytes_per_rank": None,
                                               "gathered_bytes": None, "at_world_size": None})
        merged = sum(c["bytes_out_per_rank"] for c in summary["collectives"]
                     if c["name"] == d["name"] and c["op"] == "allgather" and c.get("merged"))
        unmerged = None if sparse is None else sum(
            c["bytes_out_per_rank"] for c in sparse["collectives"] if c["name"] == d["name"] and c["op"] == "allgather")
        entry["dedup"] = {"world_size": n, "rows_largest_rank": d["rows_max"],
                          "distinct_rows_min": d["distinct_rows_min"], "distinct_rows_max": d["distinct_rows_max"],
                          "distinct_rows_per_rank": d["distinct_rows_per_rank"],
                          "gathered_bytes": merged, "unmerged_gathered_bytes": unmerged,
                          "bytes_saved": None if unmerged is None else unmerged - merged,
                          "merge_s_median": d.get("merge_s_median")}


def reduction_result(verify_summary: RunSummary | None) -> ReductionResult | None:
    """Both reductions of the same IndexedSlices gradients, compared in one process, with the
    script's own op, compression and process set."""
    if verify_summary is None:
        return None
    all_checks = verify_summary.get("reduction_checks", [])
    checks = [c for c in all_checks if "max_rel_diff" in c]
    skipped = sorted({f"{c['name']}: {c['skipped']}" for c in all_checks if c.get("skipped")})

    def rtol(check: ReductionCheckRecord) -> float:
        # Horovod gathers IndexedSlices uncompressed: only the dense path is rounded by fp16 compression.
        return verify.reduction_rtol(None if check.get("against") == "dedup" else check.get("compression"))

    def against_tolerance(check: ReductionCheckRecord) -> float:
        # 1 or less passes: float rounding's bound for the rows' sums where the check recorded it (an
        # uncompressed reduction), else the fixed relative tolerance (fp16 compression, older records).
        ratio = check.get("rounding_bound_ratio")
        return ratio if ratio is not None else float(check["max_rel_diff"]) / rtol(check)

    def worst_of(selected: list[ReductionCheckRecord]) -> ReductionFigures:
        worst = max(selected, key=against_tolerance, default=None)
        return {"max_abs_diff": None if worst is None else worst["max_abs_diff"],
                "max_rel_diff": None if worst is None else worst["max_rel_diff"],
                "rtol": verify.reduction_rtol(None) if worst is None else rtol(worst),
                "rounding_bound_ratio": None if worst is None else worst.get("rounding_bound_ratio"),
                "terms_max": max((c.get("terms_max") or 0 for c in selected), default=None) or None,
                "passed": None if not selected else all(against_tolerance(c) <= 1 for c in selected)}

    # Records older than the merged check compared the dense path only.
    by_reduction = {against: worst_of([c for c in checks if c.get("against", "dense") == against])
                    for against in ("dense", "dedup")}
    result = cast(ReductionResult, {
        "world_size": verify_summary["world_size"],
        "tensors": sorted({c["name"] for c in checks}),
        **worst_of(checks),
        "by_reduction": {k: v for k, v in by_reduction.items() if v["passed"] is not None},
        "reduce_ops": sorted({c.get("reduce_op") or "average" for c in checks}),
        "skipped": skipped,
    })
    if verify_summary.get("status", "ok") != "ok":
        # The check did not finish: that is a failed verification, not one with nothing to compare.
        result["passed"] = False
        result["failed_run"] = verify_summary.get("status")
    return result


def _parameter_check(n: int, mode: str, reference_mode: str, ref_dir: str, run_dir: str,
                     ref: RunSummary, other: RunSummary,
                     reduction: ReductionResult | None = None) -> ParameterCheck:
    """Final parameters and losses of one mode against the reference mode at the same rank count.
    ``reduction``: the comparison's reduction check (:func:`reduction_result`), the evidence a note
    explaining a failure needs (:func:`optimizer_note`)."""
    base: ParameterCheck = {"world_size": n, "mode": mode, "against": reference_mode, "max_abs_diff": None,
                            "max_rel_diff": None, "loss_max_rel_diff": None, "variables": [], "passed": None}
    varied = what_varied(ref, other)
    if varied and varied[0] == INITIAL:
        # Different starting points say nothing about the reduction: the reduction check decides.
        return {**base, "passed": None, "note": not_verifiable(reference_mode, mode, varied)}
    ref_params, params = os.path.join(ref_dir, rundir.PARAMETERS), os.path.join(run_dir, rundir.PARAMETERS)
    if not (os.path.exists(ref_params) and os.path.exists(params)):
        return {**base, "passed": None,
                "note": "no parameters saved (no gradient reduction was seen, or its variables could not be read)"}
    initial_path = os.path.join(ref_dir, rundir.INITIAL_PARAMETERS)
    initial = verify.load_parameters(initial_path) if os.path.exists(initial_path) else None
    terms = most_terms(ref, n)
    diffs = verify.compare_parameters(verify.load_parameters(ref_params), verify.load_parameters(params),
                                      initial=initial, terms=terms)
    losses = verify.compare_losses(_losses(ref), _losses(other))
    passed = all(d.passed for d in diffs) and losses <= verify.RTOL
    if not passed and varied:
        # The runs parted before any reduction: their final parameters cannot show what the reduction did.
        apart = max((d.max_abs_diff for d in diffs), default=0.0)
        return {**base, "passed": None, "note": not_verifiable(reference_mode, mode, varied, apart)}
    keras = str((other.get("versions") or {}).get("keras") or "")
    if not passed and keras.startswith("3.") and "dense" in (mode, reference_mode):
        # A failure is still a failure; the note says why only where this run's measurements support it.
        note = optimizer_note(keras, diffs, reduction)
        if note is not None:
            base["note"] = note
    return {**base, "passed": passed,
            "max_abs_diff": max((d.max_abs_diff for d in diffs), default=0.0),
            "max_rel_diff": max((d.max_rel_diff for d in diffs), default=0.0),
            "loss_max_rel_diff": losses, "variables": [cast(VariableCheck, dict(d.__dict__)) for d in diffs],
            "terms": terms if initial is not None else None,
            "update_allowance": verify.update_allowance(terms) if initial is not None else None}


INITIAL = "the initial parameters"


def what_varied(a: RunSummary, b: RunSummary) -> list[str]:
    """What differed between two runs of one script before any reduction could make them differ, as
    their records show: the initial parameters (:data:`INITIAL`, first when it is there), and each
    IndexedSlices gradient the first time it was reduced, on any rank (its rows: the data; its values with
    the same rows: sampling, or parameters memdiag could not read). A mode cannot change any of them; the
    script's own randomness can. Empty when nothing differed or nothing was recorded to tell."""
    varied = []
    if a.get("initial_params_digest") and b.get("initial_params_digest") \
            and a["initial_params_digest"] != b["initial_params_digest"]:
        varied.append(INITIAL)
    rows, values = [], []
    first_a, first_b = a.get("first_gradients") or {}, b.get("first_gradients") or {}
    for name in sorted(set(first_a) & set(first_b)):
        ranks = sorted(set(first_a[name]) & set(first_b[name]), key=int)
        if any(first_a[name][r]["indices_digest"] != first_b[name][r]["indices_digest"] for r in ranks):
            rows.append(name)
        elif any(first_a[name][r]["values_digest"] != first_b[name][r]["values_digest"] for r in ranks):
            values.append(name)
    if rows:
        varied.append(f"the rows the first step looked up (the data) in {', '.join(rows)}")
    if values:
        varied.append(f"the first step's gradient values over the same rows (sampling, or a random "
                      f"initialisation memdiag could not read) of {', '.join(values)}")
    return varied


def not_verifiable(reference_mode: str, mode: str, varied: Sequence[str], apart: float | None = None) -> str:
    """Why a parameter check cannot decide: ``varied`` (:func:`what_varied`) differed between the runs of
    ``reference_mode`` and ``mode`` before any reduction; ``apart``: their final parameters' distance."""
    distance = "" if apart is None else f" are {apart:.3g} apart, and"
    return (f"not verifiable from the final parameters: the runs of {reference_mode} and {mode}{distance} "
            f"differ before any reduction, in {'; in '.join(varied)}: the script is not deterministic. Seed "
            "TensorFlow, NumPy and Python's random to compare them")


def optimizer_note(keras: str, diffs: Sequence[verify.VariableDiff], reduction: ReductionResult | None) -> str | None:
    """Under Keras 3, why sparse and dense may part with a correct reduction, said only where two
    measurements support it (None otherwise):

    - the reduction: the comparison's reduction check reduced the same IndexedSlices gradients by
      allgather and by dense allreduce and found them within float rounding's bound for their sums
      (``rounding_bound_ratio`` <= 1), so the collectives hand the optimizer the same gradient;
    - the gap is of the optimizer's size: in every variable that failed, max |sparse - dense| is at
      most the reference's own largest update of it (|final - initial|, from params_initial.npz). Keras
      3's Adam moves a row looked up k times with one sign sqrt(k) times as far as IndexedSlices as
      densified (docs/howto/failed-check.md), a gap of (sqrt(k) - 1)/sqrt(k) of the sparse run's update: a
      part of the update, never more than all of it. A larger gap (a parameter that moved 1e-4 ending
      1e-2 apart) is not an optimizer applying the same gradient otherwise.
    """
    dense = (reduction.get("by_reduction") or {}).get("dense") if reduction else None
    ratio = dense.get("rounding_bound_ratio") if dense else None
    if not dense or dense.get("passed") is not True or ratio is None or ratio > 1:
        return None
    failed = [d for d in diffs if not d.passed]
    if not failed or any(d.max_update is None or d.max_abs_diff > d.max_update for d in failed):
        return None
    worst = max(failed, key=lambda d: d.max_abs_diff / d.max_update if d.max_update else float("inf"))
    return (f"under Keras {keras} the optimizer applies an IndexedSlices with repeated rows otherwise than its "
            "dense sum (Adam's second moment adds each row's square, not the square of their sum; "
            f"docs/howto/failed-check.md): the reduction check found both reductions within "
            f"{ratio:.2g} of float rounding's bound, and the largest gap, "
            f"{worst.max_abs_diff:.3g} in {worst.name}, is within that variable's own largest update "
            f"({worst.max_update:.3g}): sparse and dense train apart whatever the reduction")


def rank_order_check(check: ParameterCheck, ref_dir: str, ref: RunSummary, order_dir: str,
                     run_dir: str, run: RunSummary) -> ParameterCheck:
    """A failed parameter check, looked at again: the same mode at the same rank count run once more
    with Open MPI's allreduce summing the ranks' gradients in rank order, the order in which the
    allgather path's optimizer sums the gathered rows. The rounding of a float32 sum depends on its
    order, and Adam divides by sqrt(v): where that is near its epsilon a rounding-sized change of a
    gradient moves the update by a visible fraction (docs/explanation/correctness.md, "When the parameter check
    fails a correct reduction").

    The check passes if the re-run agrees with the reference within the same tolerance, or if the
    measured run is no farther from the reference than from its own re-run (``spread``): the two
    runs of one mode differ in MPI's summation order alone, so their distance is what rounding does
    to this job's parameters, and a difference between modes within it is within that noise. Both
    are per variable, the losses too. A wrong reduction stays failed: its re-run is as wrong, so
    the two runs of the mode agree with each other and not with the reference."""
    order_summary = load_summary(order_dir)
    varied = what_varied(run, order_summary)
    if varied:
        # The two runs of the mode parted before any reduction: their distance is not the summation order's.
        return {**check, "passed": None, "as_run_passed": False,
                "note": not_verifiable(check["mode"], f"{check['mode']} again", varied)}
    order = _parameter_check(check["world_size"], check["mode"], check["against"], ref_dir, order_dir,
                             ref, order_summary)
    if order["passed"] is None:
        return check
    look = _second_look(order, order_dir)
    passed = bool(order["passed"])
    if not passed:
        spread = _parameter_check(check["world_size"], check["mode"], check["mode"], run_dir, order_dir,
                                  run, load_summary(order_dir))
        if spread["passed"] is not None:
            look["spread"] = _spread(check, spread)
            passed = look["spread"]["within"]
    return {**check, "passed": passed, "as_run_passed": False, "rank_order": look}


def _spread(check: ParameterCheck, spread: ParameterCheck) -> SpreadCheck:
    """What compare.json keeps of the distance between two runs of one job (``spread``), and whether
    the failed ``check`` is within it (:func:`within_spread`)."""
    return {"max_abs_diff": spread["max_abs_diff"], "loss_max_rel_diff": spread["loss_max_rel_diff"],
            "within": within_spread(check, spread)}


def within_spread(check: ParameterCheck, spread: ParameterCheck) -> bool:
    """Whether every variable that failed ``check`` is no farther from the reference than the two
    runs of its mode are from each other (``spread``: the same job, another summation order), and
    the losses as close."""
    apart = {v["name"]: v["max_abs_diff"] for v in spread["variables"]}
    for v in check["variables"]:
        if v["passed"]:
            continue
        if v["name"] not in apart or not math.isfinite(v["max_abs_diff"]) or v["max_abs_diff"] > apart[v["name"]]:
            return False
    loss, spread_loss = check["loss_max_rel_diff"], spread["loss_max_rel_diff"]
    if loss is None or spread_loss is None:
        return False  # not compared: nothing shows the check within the spread
    return bool(loss <= max(verify.RTOL, spread_loss))


def _second_look(found: ParameterCheck, order_dir: str) -> RankOrderLook:
    """What compare.json keeps of a check against a rank-order run (``rank_order``)."""
    return {"run": os.path.basename(os.path.normpath(order_dir)), "passed": found["passed"],
            "max_abs_diff": found["max_abs_diff"], "max_rel_diff": found["max_rel_diff"],
            "loss_max_rel_diff": found["loss_max_rel_diff"]}


def rank_order_candidates(run_dirs: Mapping[tuple[int, str], str],
                          reference_mode: str = "sparse") -> dict[tuple[int, str], tuple[int, str]]:
    """The (rank count, mode) pairs whose parameter check fails and whose mode reduces IndexedSlices
    by dense allreduce: each needs a rank-order run (:func:`rank_order_check`). Each maps to the pair
    whose run it can share: a mode whose final parameters equal, bit for bit, another candidate's at
    the same rank count (``auto`` that densified every table is ``dense``) shares that one's run."""
    summaries = {key: load_summary(path) for key, path in run_dirs.items()}
    failed = [(c["world_size"], c["mode"]) for c in correctness(dict(run_dirs), summaries, None,
                                                                   reference_mode)["checks"]
              if c["passed"] is False and c["mode"] in RANK_ORDER_MODES]
    shared: dict[tuple[int, str], tuple[int, str]] = {}
    for key in failed:
        shared[key] = next((other for other in dict.fromkeys(shared.values())
                            if other[0] == key[0] and _same_parameters(run_dirs[other], run_dirs[key])), key)
    return shared


def _same_parameters(dir_a: str, dir_b: str) -> bool:
    a = verify.load_parameters(os.path.join(dir_a, rundir.PARAMETERS))
    b = verify.load_parameters(os.path.join(dir_b, rundir.PARAMETERS))
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


def most_terms(summary: RunSummary, world_size: int) -> int:
    """The most numbers one reduced gradient element can sum in a run: the rows gathered for a gathered
    gradient (every gathered row may carry the same index: the sum over the ranks of their rows), N for
    a dense one. Summaries older than ``rows_gathered`` give N x their policy's agreed rows (or its own)."""
    rows = [gathered if (gathered := p.get("rows_gathered")) is not None
            else world_size * (p.get("agreed_rows") or p.get("local_rows") or 0) for p in summary.get("policy", [])]
    return max([world_size, *rows])


# Modes whose IndexedSlices go through the dense allreduce: a failed parameter check of theirs gets a
# second look with MPI's allreduce summing in rank order (:func:`rank_order_check`).
RANK_ORDER_MODES = ("dense", "auto")


def correctness(run_dirs: dict[tuple[int, str], str], summaries: dict[tuple[int, str], RunSummary],
                verify_summary: RunSummary | None = None, reference_mode: str = "sparse",
                order_dirs: Mapping[tuple[int, str], str] | None = None) -> Correctness:
    """Parameters and losses of every mode against the reference mode at the same rank count,
    and the reduction check of the verification run. ``passed`` is None when nothing could be checked.
    ``order_dirs``: for a (rank count, mode) whose check failed, the same run again with MPI's
    allreduce in rank order (:func:`rank_order_check` says what it decides)."""
    checks = []
    reduction = reduction_result(verify_summary)
    for (n, mode), run_dir in sorted(run_dirs.items()):
        ref_key = (n, reference_mode)
        if mode == reference_mode or ref_key not in run_dirs:
            continue
        if summaries[ref_key].get("status") != "ok" or summaries[(n, mode)].get("status") != "ok":
            continue  # a run that did not finish is reported as such, not as a numerical difference
        check = _parameter_check(n, mode, reference_mode, run_dirs[ref_key], run_dir,
                                 summaries[ref_key], summaries[(n, mode)], reduction)
        order_dir = (order_dirs or {}).get((n, mode))
        if check["passed"] is False and order_dir is not None:
            check = rank_order_check(check, run_dirs[ref_key], summaries[ref_key], order_dir, run_dir,
                                     summaries[(n, mode)])
        checks.append(check)
    consistent = [s["consistency"].get("ranks_identical") for s in summaries.values()]
    ranks_identical = None if all(c is None for c in consistent) else all(c is not False for c in consistent)
    verdicts = [c["passed"] for c in checks] + [ranks_identical] + [None if reduction is None else reduction["passed"]]
    known = [v for v in verdicts if v is not None]
    compared = [c for c in checks if c["passed"] is not None]
    # A pass needs evidence that the modes train alike: a parameter check that compared, or the reduction
    # check. Ranks that agree with each other say nothing about the modes.
    evidence = bool(compared) or (reduction is not None and reduction["passed"] is not None)
    return {
        "passed": None if not known or (all(known) and not evidence) else all(known),
        "max_abs_diff": max((c["max_abs_diff"] or 0.0 for c in compared), default=None),
        "max_rel_diff": max((c["max_rel_diff"] or 0.0 for c in compared), default=None),
        "rtol": verify.RTOL,
        "atol": verify.ATOL,
        "terms_max": max((terms for c in compared if (terms := c.get("terms"))), default=None),
        "update_allowance": max((allowance for c in compared if (allowance := c.get("update_allowance"))),
                                default=None),
        "ranks_identical_every_step": ranks_identical,
        "reduction": reduction,
        "notes": sorted({c["note"] for c in checks if c.get("note")}),
        "checks": checks,
    }


def _losses(summary: RunSummary) -> list[float | None]:
    """The loss of each requested step: warm-up steps (``--max-warmup``, added where a run's peaks had
    not settled) differ in number between runs and are left out, as the compared parameters are saved
    after the requested steps."""
    requested = summary.get("steps")
    return [s["loss_mean"] for s in summary.get("steps_detail", [])
            if not isinstance(requested, int) or s.get("step", 0) < requested]


def headline(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """When a memory limit killed some runs and not others, that is the news."""
    killed = [r for r in rows if (r.get("failure") or {}).get("kind") == "mem-limit"]
    if not killed:
        return None
    parts = []
    for row in killed:
        parts.append(f"{row['mode']} at N={row['world_size']}: {row['failure']['headline']}")
    survivors = sorted({(r["mode"], r["world_size"]) for r in rows if r["status"] == "ok"
                        and r["world_size"] in {k["world_size"] for k in killed}})
    text = "killed by the memory limit: " + "; ".join(parts)
    if survivors:
        text += ". Completed under the same limit: " + ", ".join(f"{m} at N={n}" for m, n in survivors)
    return text


def build(target: str, preset: str | None, run_dirs: Mapping[tuple[int, str], str | list[str]],
          verify_dir: str | None = None, order_dirs: Mapping[tuple[int, str], str] | None = None) -> Comparison:
    """The comparison of every (rank count, mode): each key holds one run directory or, with
    ``--repeats``, several; their peaks give the median and the run-to-run spread."""
    repeats = {key: [paths] if isinstance(paths, str) else list(paths) for key, paths in run_dirs.items()}
    firsts = {key: paths[0] for key, paths in repeats.items()}
    every = {key: [load_summary(path) for path in paths] for key, paths in repeats.items()}
    summaries = {key: runs[0] for key, runs in every.items()}
    verify_summary = load_summary(verify_dir) if verify_dir else None
    rows = [with_repeats(table_row(summaries[key], firsts[key]), every[key]) for key in sorted(summaries)]
    fit_from = 2 if len({r["world_size"] for r in rows if r["world_size"] >= 2}) >= 2 else 1
    result: Comparison = {
        "headline": headline(rows),
        "workload": target,
        "preset": preset,
        "rows": rows,
        # One rank runs no collective and allocates none of Horovod's buffers: growth per added
        # rank is fitted from N >= 2 where two such rank counts exist.
        "growth_bytes_per_rank": growth(rows, "steady_peak_rss_bytes_median", fit_from),
        "collective_growth_bytes_per_rank": growth(rows, "collective_bytes_per_rank", fit_from),
        # Modelled, from the records (no RSS noise): the collective outputs alive at once per step, as
        # summary.live_collective_bytes counts them (its docstring names the assumptions).
        "live_growth_bytes_per_rank": growth([r for r in rows if r.get("collective_live_peak_bytes") is not None],
                                             "collective_live_peak_bytes", fit_from),
        "growth_fitted_from_world_size": fit_from,
        "predicted_growth_bytes_per_rank": predicted_growth(summaries, fit_from),
        "tensors": growth_tensors(summaries, fit_from),
        "correctness": correctness(firsts, summaries, verify_summary, order_dirs=order_dirs),
        "oversubscribed": any(s.get("oversubscribed") for s in summaries.values()),
        "memory_environment": {k: v for s in summaries.values() for k, v in (s.get("memory_environment") or {}).items()},
        "all_ok": all(r["status"] == "ok" for r in rows),
        "noise_bytes": noise(rows),
        "noise_source": "repeats" if noise(rows) is not None else None,
    }
    if result["noise_bytes"] is None:
        result["noise_bytes"] = rank_noise(summaries)
        result["noise_source"] = "ranks" if result["noise_bytes"] is not None else None
    result["physics"] = physics(result, summaries)
    return result


def with_repeats(row: CompareRow, runs: list[RunSummary]) -> CompareRow:
    """A row's peak as the median over repeated runs, with their spread (max - min)."""
    peaks = [r.get("steady_peak_rss_bytes_max") or r.get("peak_rss_bytes_max") for r in runs
             if r.get("status") == "ok"]
    found: list[float] = [p for p in peaks if p]
    row["repeats"] = len(runs)
    if len(found) > 1:
        row["steady_peak_rss_bytes_median"] = statistics.median(found)
        row["peak_spread_bytes"] = max(found) - min(found)
    else:
        row["peak_spread_bytes"] = None
    return row


def noise(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The run-to-run noise of a per-rank peak: the largest spread over the repeated configurations."""
    spreads = [r["peak_spread_bytes"] for r in rows if r.get("peak_spread_bytes") is not None]
    return max(spreads) if spreads else None


def rank_noise(summaries: Mapping[tuple[int, str], RunSummary]) -> float | None:
    """Without repeats, the noise floor one run gives: the largest spread of the steady peaks between the
    ranks of one run (N >= 2), which run the same program on the same data sizes. It is larger than the
    run-to-run noise where ranks differ systematically (rank 0 saves the parameters), so it errs on the
    side of "within noise"."""
    spreads = []
    for (n, _), summary in summaries.items():
        peaks = [r.get("steady_peak_rss_bytes") for r in summary.get("ranks", [])]
        found = [p for p in peaks if p]
        if n >= 2 and summary.get("status") == "ok" and len(found) >= 2:
            spreads.append(max(found) - min(found))
    return max(spreads) if spreads else None


def physics(result: Comparison, summaries: dict[tuple[int, str], RunSummary]) -> Physics:
    """The figures of the verdict: how sparse grows against k x the formula, how flat dense stays,
    what auto chose and what it saved, which phase set each peak, and whether each difference is
    larger than the noise."""
    by_key = {(r["world_size"], r["mode"]): r for r in result["rows"] if r["status"] == "ok"}
    counts = sorted({n for n, _ in by_key})
    largest = max(counts, default=None)
    multi = [n for n in counts if n >= 2]
    predicted = result.get("predicted_growth_bytes_per_rank")
    k = None
    sparse = [s for (n, mode), s in summaries.items() if mode == "sparse" and n > 1]
    if sparse:
        from memdiag.analyze.model import build_model

        try:
            k = build_model([max(sparse, key=lambda s: s["world_size"])]).cost_per_gathered_byte
        except UserError:
            k = None
    noise_bytes = result.get("noise_bytes")

    def peak(n: int | None, mode: str) -> float | None:
        row = by_key.get((n, mode)) if n is not None else None
        return None if row is None else row["steady_peak_rss_bytes_median"]

    def beyond_noise(a: float | None, b: float | None) -> bool | None:
        if a is None or b is None or noise_bytes is None:
            return None
        return bool(abs(a - b) > noise_bytes)

    dense_low, dense_high = (peak(min(multi), "dense"), peak(max(multi), "dense")) if len(multi) >= 2 else (None, None)
    fixed: dict[str, float] = {}
    for mode in ("sparse", "dedup", "dense"):
        value = peak(largest, mode)
        if value is not None:
            fixed[mode] = value
    best = min(fixed.values(), default=None)
    auto_peak = peak(largest, "auto")
    every = {**fixed, **({} if auto_peak is None else {"auto": auto_peak})}
    sparse_peak = peak(largest, "sparse")
    densified = [t["name"] for t in result.get("tensors", []) if t.get("auto_decision") == "dense"]
    merged = [t["name"] for t in result.get("tensors", []) if t.get("auto_decision") == "dedup"]
    handed_dense = [t["name"] for t in result.get("tensors", []) if t.get("auto_optimizer_input") == "dense"]
    sparse_growth = result["growth_bytes_per_rank"].get("sparse")
    predicted_rss = None if predicted is None or k is None else k * predicted
    fitted = [n for n in counts if (n, "sparse") in by_key and n >= result.get("growth_fitted_from_world_size", 1)]
    # The fitted growth against k x the formula, as the difference it makes to the peak across the
    # rank counts fitted: no larger than the noise, the two agree within noise.
    growth_within_noise = None
    if sparse_growth is not None and predicted_rss is not None and noise_bytes is not None and len(fitted) >= 2:
        growth_within_noise = abs(sparse_growth - predicted_rss) * (fitted[-1] - fitted[0]) <= noise_bytes
    segments: list[GrowthSegment] = []
    for a, b in zip(fitted, fitted[1:]):
        low, high = peak(a, "sparse"), peak(b, "sparse")
        if low is None or high is None or predicted_rss is None:
            continue
        measured = (high - low) / (b - a)
        gap = (measured - predicted_rss) * (b - a)  # what the model leaves over the segment
        segments.append({"from_world_size": a, "to_world_size": b, "measured_bytes_per_rank": measured,
                         "predicted_bytes_per_rank": predicted_rss, "unexplained_bytes_per_rank": measured - predicted_rss,
                         "beyond_noise": None if noise_bytes is None else bool(abs(gap) > noise_bytes)})
    return {
        "largest_world_size": largest,
        "cost_per_gathered_byte": k,
        "sparse_growth_bytes_per_rank": sparse_growth,
        "predicted_rss_growth_bytes_per_rank": predicted_rss,
        "sparse_growth_within_noise": growth_within_noise,
        # between each two rank counts fitted: the growth measured against k x the formula's
        "sparse_segments": segments,
        "sparse_live_growth_bytes_per_rank": (result.get("live_growth_bytes_per_rank") or {}).get("sparse"),
        "dense_change": None if not dense_low or dense_high is None else (dense_high - dense_low) / dense_low,
        "dense_peak_bytes": dense_high if dense_high is not None else peak(largest, "dense"),
        "auto_densified": densified,
        "auto_merged": merged,
        "auto_dense_to_optimizer": handed_dense,
        "best_fixed_mode": None if not fixed else min(fixed, key=lambda m: fixed[m]),
        "lowest_peak_mode": min(every, key=lambda m: every[m]) if every else None,
        "auto_vs_sparse": None if auto_peak is None or not sparse_peak else auto_peak / sparse_peak - 1,
        "auto_minus_best_bytes": None if auto_peak is None or best is None else auto_peak - best,
        "auto_vs_best_beyond_noise": beyond_noise(auto_peak, best),
        "phases": {mode: {str(n): summaries[(n, mode)].get("peak_phase") for n in counts if (n, mode) in summaries}
                   for mode in sorted({m for _, m in summaries})},
        "noise_bytes": noise_bytes,
        "noise_source": result.get("noise_source"),
    }


# -- two engines (--engine both) ---------------------------------------------------------------------

def build_engines(target: str, preset: str | None,
                  run_dirs: Mapping[str, Mapping[tuple[int, str], str | list[str]]],
                  verify_dirs: Mapping[str, str] | None = None,
                  order_dirs: Mapping[str, Mapping[tuple[int, str], str]] | None = None) -> EnginesComparison:
    """Every (engine, rank count, mode): each engine's own comparison (``engines``), the rows side by
    side, the verdict across engines and the parameters of each engine against the first one's."""
    verify_dirs, order_dirs = verify_dirs or {}, order_dirs or {}
    order = list(run_dirs)
    results: dict[str, Comparison] = {}
    for engine, dirs in run_dirs.items():
        results[engine] = build(target, preset, dirs, verify_dirs.get(engine), order_dirs.get(engine))
        results[engine]["engine"] = engine
    firsts = {engine: {key: paths if isinstance(paths, str) else paths[0] for key, paths in dirs.items()}
              for engine, dirs in run_dirs.items()}
    summaries = {engine: {key: load_summary(path) for key, path in dirs.items()} for engine, dirs in firsts.items()}
    rows = [engine_row(engine, row, summaries[engine][(row["world_size"], row["mode"])])
            for engine in order for row in results[engine]["rows"]]
    rows.sort(key=lambda r: (r["world_size"], order.index(r["engine"]), r["mode"]))
    across = across_engines(order, firsts, summaries, order_dirs.get(order[0]))
    verdicts = [results[e]["correctness"]["passed"] for e in order] + [c["passed"] for c in across]
    known = [v for v in verdicts if v is not None]
    compared = [c["passed"] for c in across if c["passed"] is not None]
    headlines = [f"{e}: {results[e]['headline']}" for e in order if results[e].get("headline")]
    return {
        "engine": "both",
        "engine_order": order,
        "workload": target,
        "preset": preset,
        "headline": "; ".join(headlines) or None,
        "side_by_side": rows,
        "verdict": engines_verdict(order, rows, results, summaries),
        "correctness": {
            "passed": None if not known else all(known),
            "by_engine": {e: results[e]["correctness"]["passed"] for e in order},
            # The engines whose verification run ran (each engine compared makes one, from N=2 on).
            "reduction_checked": [e for e in order if results[e]["correctness"].get("reduction") is not None],
            "across_engines": across,
            "across_engines_passed": None if not compared else all(compared),
            "rtol": verify.RTOL,
            "atol": verify.ATOL,
        },
        "engines": results,
        "all_ok": all(results[e]["all_ok"] for e in order),
        "oversubscribed": any(results[e].get("oversubscribed") for e in order),
        "memory_environment": {k: v for e in order for k, v in (results[e].get("memory_environment") or {}).items()},
    }


def engine_row(engine: str, row: CompareRow, summary: RunSummary) -> EngineRow:
    """One engine's comparison row with its gathered bytes split from MWMS's gathers of the row counts,
    its padding, and the formula's figures for it."""
    collectives = summary.get("collectives", [])
    # A tensor's counts are gathered once per step: bytes of one call times the calls per step.
    lengths = sum(int(c["bytes_out_per_rank"]) * round(c.get("calls_per_step") or 1) for c in collectives
                  if c["op"] == "allgather" and c.get("part") == "lengths")
    padding_engine = any("rows_per_worker" in p for p in summary.get("policy", []))
    return {
        "world_size": row["world_size"],
        "engine": engine,
        "mode": row["mode"],
        "status": row["status"],
        "steady_peak_rss_bytes_median": row.get("steady_peak_rss_bytes_median"),
        "peak_spread_bytes": row.get("peak_spread_bytes"),
        "repeats": row.get("repeats", 1),
        "peak_phase": row.get("peak_phase"),
        "gathered_bytes_per_rank": row["allgather_bytes_per_rank"] - lengths,
        "lengths_bytes_per_rank": lengths,
        "predicted_gathered_bytes_per_rank": predicted_gathered(summary, row["world_size"]),
        "padding_bytes_per_rank": sum(int(p["padding_bytes_per_step"]) for p in summary.get("padding", []))
        if padding_engine else None,
        "predicted_padding_bytes_per_rank": predicted_padding(summary) if padding_engine else None,
        "allreduce_bytes_per_rank": row["allreduce_bytes_per_rank"],
        "run_dir": row["run_dir"],
    }


def _gathered_policies(summary: RunSummary) -> list[PolicySummary]:
    """The policy records of the IndexedSlices gradients the run gathered, with their shapes."""
    return [p for p in summary.get("policy", []) if _rows_gathered(p, 1) is not None and p.get("decision") != "dense"
            and p.get("row_bytes") is not None]


def _rows_gathered(policy: Mapping[str, Any], world_size: int) -> int | None:
    """The rows each rank receives per step for this gradient: the summary's ``rows_gathered`` (the sum
    over the ranks of their own rows, MWMS: N x the longest's), or for summaries older than it, N x the
    policy's agreed rows, or the own rows of whichever rank was read first."""
    if policy.get("rows_gathered") is not None:
        return int(policy["rows_gathered"])
    rows = policy.get("agreed_rows") if policy.get("agreed_rows") is not None else policy.get("local_rows")
    return None if rows is None else world_size * rows


def predicted_gathered(summary: RunSummary, world_size: int) -> int | None:
    """Bytes per rank and step the formula gives for the tensors the run gathered: the rows gathered x
    (row_bytes + index_bytes), each rank's own rows summed (exact for Horovod's allgatherv whatever the
    ranks' rows, and for MWMS's padded gathers); merged, the bound N x U_max. None when no record has
    shapes, or a gathered tensor's are unknown (a sum without it would pass for the whole)."""
    if world_size == 1:
        return 0  # one rank runs no collective: neither engine reduces anything (nor records a policy)
    policies = summary.get("policy", [])
    if not any(_rows_gathered(p, world_size) is not None for p in policies):
        return None
    if len(_gathered_policies(summary)) < sum(p.get("decision") != "dense" for p in policies):
        return None
    total = 0
    for p in _gathered_policies(summary):
        if p["decision"] == "dedup":
            distinct = p.get("distinct_rows")
            if distinct is None:
                return None
            total += formula.merged_bytes(world_size, distinct, p["row_bytes"], p["index_bytes"])
        else:
            total += formula.gathered_bytes(1, _rows_gathered(p, world_size) or 0, p["row_bytes"], p["index_bytes"])
    return total


def predicted_padding(summary: RunSummary) -> int:
    """MWMS's zero rows per worker and step from every worker's rows in the policy records."""
    return sum(formula.padding_bytes(p["rows_per_worker"], p["row_bytes"], p["index_bytes"])
               for p in _gathered_policies(summary) if p.get("rows_per_worker"))


def across_engines(order: Sequence[str], run_dirs: Mapping[str, Mapping[tuple[int, str], str]],
                   summaries: Mapping[str, Mapping[tuple[int, str], RunSummary]],
                   reference_order_dirs: Mapping[tuple[int, str], str] | None = None) -> list[CrossEngineCheck]:
    """Final parameters of each engine's runs against the reference engine's (the first) at the same rank
    count and mode: the same data and initial values; Horovod averages the gradients, MWMS sums the
    gradients of a loss scaled by 1/N, so they differ by float rounding only, within the tolerance of
    the parameter check between modes (docs/explanation/correctness.md). Where a pair fails and the reference made a
    rank-order run of that (rank count, mode) for its own check (:func:`rank_order_check`), the pair is
    compared again against that run, which differs from the reference's in the summation order alone:
    it passes if that agrees, or if every variable that failed is no farther from the reference's run
    than the reference's two runs are from each other (``spread``, as :func:`rank_order_check` does),
    every figure kept."""
    reference, *others = order
    checks: list[CrossEngineCheck] = []
    for engine in others:
        for (n, mode), path in sorted(run_dirs[engine].items()):
            ref_dir = run_dirs[reference].get((n, mode))
            ref, other = summaries[reference].get((n, mode)), summaries[engine][(n, mode)]
            if ref_dir is None or ref is None or ref.get("status") != "ok" or other.get("status") != "ok":
                continue
            found = _parameter_check(n, mode, mode, ref_dir, path, ref, other)
            check: CrossEngineCheck = {
                "world_size": n, "mode": mode, "engine": engine, "against_engine": reference,
                "passed": found["passed"], "max_abs_diff": found["max_abs_diff"], "max_rel_diff": found["max_rel_diff"],
                "loss_max_rel_diff": found["loss_max_rel_diff"], "update_allowance": found.get("update_allowance"),
                "terms": found.get("terms"),
                "worst_variable": max(found["variables"], key=lambda d: d["max_abs_diff"])["name"]
                if found["variables"] else None}
            if found.get("note"):
                check["note"] = found["note"]
            order_dir = (reference_order_dirs or {}).get((n, mode))
            if found["passed"] is False and order_dir is not None:
                order_summary = load_summary(order_dir)
                again = _parameter_check(n, mode, mode, order_dir, path, order_summary, other)
                if again["passed"] is not None:
                    check["as_run_passed"] = False
                    check["passed"] = again["passed"]
                    look = check["rank_order"] = _second_look(again, order_dir)
                    if not again["passed"]:
                        # the reference engine's two runs, which differ in MPI's summation order alone
                        spread = _parameter_check(n, mode, mode, ref_dir, order_dir, ref, order_summary)
                        if spread["passed"] is not None:
                            look["spread"] = _spread(found, spread)
                            check["passed"] = look["spread"]["within"]
            checks.append(check)
    return checks


def engines_verdict(order: Sequence[str], rows: Sequence[EngineRow], results: Mapping[str, Mapping[str, Any]],
                    summaries: Mapping[str, Mapping[tuple[int, str], RunSummary]]) -> EnginesVerdict:
    """The figures of the verdict at the largest rank count: every (engine, mode) peak, lowest first,
    the lowest's lead and the gap between the engines' lowest peaks against the noise (the larger of
    the engines'), the gathered bytes of each
    engine's sparse run, MWMS's padding and whether every worker had the same rows, and whether the
    measured gathered bytes equal the formula's."""
    done = [r for r in rows if r["status"] == "ok" and r.get("steady_peak_rss_bytes_median")]
    largest = max((r["world_size"] for r in done), default=None)
    at = sorted((r for r in done if r["world_size"] == largest), key=lambda r: r["steady_peak_rss_bytes_median"] or 0)
    peaks: list[EnginePeak] = [
        {"engine": r["engine"], "mode": r["mode"], "peak_rss_bytes": r["steady_peak_rss_bytes_median"] or 0} for r in at]
    lead = peaks[1]["peak_rss_bytes"] - peaks[0]["peak_rss_bytes"] if len(peaks) >= 2 else None
    best: dict[str, EnginePeak] = {}
    for p in peaks:  # lowest first: the first of each engine is its best
        best.setdefault(p["engine"], p)
    ranked = [best[e] for e in order if e in best]
    gap = ranked[1]["peak_rss_bytes"] - ranked[0]["peak_rss_bytes"] if len(ranked) >= 2 else None
    measured = [res for res in results.values() if res.get("noise_bytes") is not None]
    noise_bytes = max((res["noise_bytes"] for res in measured), default=None)
    sources = {res.get("noise_source") for res in measured}
    sparse = {r["engine"]: r for r in at if r["mode"] == "sparse"}
    gathered = {e: sparse[e]["gathered_bytes_per_rank"] for e in order if e in sparse}
    reference = order[0]
    others = [e for e in order[1:] if e in gathered]
    ratio = None
    if reference in gathered and others and gathered[reference]:
        ratio = gathered[others[0]] / gathered[reference]
    padded = [r for r in sparse.values() if r.get("padding_bytes_per_rank") is not None]
    rows_per_worker: dict[str, list[int]] = {}
    if padded and largest is not None:
        summary = summaries[padded[0]["engine"]][(largest, "sparse")]
        rows_per_worker = {p["name"]: list(p["rows_per_worker"]) for p in _gathered_policies(summary)
                           if p.get("rows_per_worker")}
    exact: dict[str, bool] = {}
    for engine in order:
        pairs = [(r["gathered_bytes_per_rank"], r["predicted_gathered_bytes_per_rank"]) for r in rows
                 if r["engine"] == engine and r["mode"] == "sparse" and r["status"] == "ok"
                 and r.get("predicted_gathered_bytes_per_rank") is not None]
        if pairs:
            exact[engine] = all(a == b for a, b in pairs)
    return {
        "world_size": largest,
        "peaks": peaks,
        "lead_bytes": lead,
        "noise_bytes": noise_bytes,
        "noise_source": None if not sources else ("repeats" if sources == {"repeats"} else "ranks"),
        "lead_beyond_noise": None if lead is None or noise_bytes is None else lead > noise_bytes,
        "best_by_engine": best,
        "engine_gap_bytes": gap,
        "engine_gap_beyond_noise": None if gap is None or noise_bytes is None else abs(gap) > noise_bytes,
        "gathered_bytes": gathered,
        "gathered_ratio": ratio,
        "padding_bytes": padded[0]["padding_bytes_per_rank"] if padded else None,
        "rows_per_worker": rows_per_worker,
        "equal_rows": None if not rows_per_worker else all(len(set(v)) == 1 for v in rows_per_worker.values()),
        "formula_exact": exact,
    }
