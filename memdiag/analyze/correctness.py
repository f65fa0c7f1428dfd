"""A comparison's correctness: each mode's parameters and losses against the reference mode's, and the reduction check.

Each mode's final parameters and losses are compared with the reference mode's at the same rank
count (:func:`parameter_check`); the verification run reduces the same IndexedSlices gradients both
ways in one process (:func:`reduction_result`); a failed check of a mode that reduces by dense
allreduce is looked at again against a run summing in rank order (:func:`rank_order_check`). A check
cannot decide where the runs differed before any reduction (:func:`what_varied`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from memdiag.analyze import verify
from memdiag.format import rundir
from memdiag.format.records import ReductionCheckRecord
from memdiag.format.results import (
    Correctness,
    ParameterCheck,
    RankOrderLook,
    ReductionFigures,
    ReductionResult,
    RunSummary,
    SpreadCheck,
    VariableCheck,
)


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


def parameter_check(n: int, mode: str, reference_mode: str, ref_dir: str, run_dir: str,
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
    order_summary = rundir.read_summary(order_dir)
    varied = what_varied(run, order_summary)
    if varied:
        # The two runs of the mode parted before any reduction: their distance is not the summation order's.
        return {**check, "passed": None, "as_run_passed": False,
                "note": not_verifiable(check["mode"], f"{check['mode']} again", varied)}
    order = parameter_check(check["world_size"], check["mode"], check["against"], ref_dir, order_dir,
                            ref, order_summary)
    if order["passed"] is None:
        return check
    look = second_look(order, order_dir)
    passed = bool(order["passed"])
    if not passed:
        spread = parameter_check(check["world_size"], check["mode"], check["mode"], run_dir, order_dir,
                                 run, rundir.read_summary(order_dir))
        if spread["passed"] is not None:
            look["spread"] = spread_check(check, spread)
            passed = look["spread"]["within"]
    return {**check, "passed": passed, "as_run_passed": False, "rank_order": look}


def spread_check(check: ParameterCheck, spread: ParameterCheck) -> SpreadCheck:
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


def second_look(found: ParameterCheck, order_dir: str) -> RankOrderLook:
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
    summaries = {key: rundir.read_summary(path) for key, path in run_dirs.items()}
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
        check = parameter_check(n, mode, reference_mode, run_dirs[ref_key], run_dir,
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
