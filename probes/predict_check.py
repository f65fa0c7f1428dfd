"""Issue 22's evidence table: for user scripts and a built-in workload, the gathered bytes per rank counted
from the records against the formula of summary.json, and `memdiag predict --ranks 8` fitted on N = 1, 2, 4
against a measured N = 8 run.

    .venv/bin/python probes/predict_check.py [--out runs/predict-check] [--only uneven,groups] [--reuse]

For each workload it runs (from the repository's root, with `.venv/bin/memdiag`)

    memdiag compare sparse-vs-dense TARGET -n 1,2,4 --modes sparse,dense --out OUT/NAME-cmp [-- ARGS]
    memdiag predict OUT/NAME-cmp --ranks 8 --modes sparse --format json
    memdiag run TARGET -n 8 --mode sparse --out OUT/NAME-n8 [-- ARGS]

then prints one table row. `--reuse` keeps a directory that holds a finished run or comparison and runs only
what is missing; the table alone can be re-read from existing directories that way.

Columns: "records" is the most bytes any rank received by allgather of gradients in one training step, summed
from the rank files' collective records (read with memdiag.format.reader, not summary.json's figures); "formula"
is the sum over gathered gradients of summary.json's ``formula_gathered_bytes``; "records=formula" says, per N
of the workload's sparse runs, whether the two are equal to the byte ("=") or not ("NO"). "pred 8" / "meas 8" are predict's
gathered bytes per rank at N = 8 and the records' at N = 8; the peaks are predict's peak per rank and the
N = 8 run's steady peak of the largest rank, with the phase summary.json says set it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

MEMDIAG = os.path.join(".venv", "bin", "memdiag")
STEPS = "4"


@dataclass(frozen=True)
class Workload:
    name: str
    target: str
    script_args: tuple[str, ...]  # after `--`; empty for a built-in workload
    memdiag_args: tuple[str, ...] = ()

    @property
    def builtin(self) -> bool:
        return not self.target.endswith(".py")


WORKLOADS = (
    Workload("uneven", "tests/uneven_rows_script.py", ("--steps", STEPS)),
    Workload("unknown-rows", "tests/uneven_rows_script.py", ("--steps", STEPS, "--unknown-rows")),
    Workload("groups", "examples/user_groups.py", ("--steps", STEPS)),
    Workload("eager", "examples/user_tape_eager.py", ("--steps", STEPS)),
    Workload("keras-fit", "examples/user_keras_fit.py", ("--epochs", "1", "--batches", STEPS)),
    # compare gives a built-in workload up to 3 more steps to settle (--max-warmup); the N = 8 run gets the same
    Workload("transformer-tiny", "transformer", (), ("--preset", "tiny", "--steps", STEPS, "--max-warmup", "3")),
)


def run_logged(cmd: list[str], log: str) -> int:
    start = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    print(f"  [{time.monotonic() - start:.0f} s, exit {code}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    return code


def finished(path: str, marker: str) -> bool:
    return os.path.isfile(os.path.join(path, marker))


def measure(w: Workload, out: str, reuse: bool) -> None:
    cmp_dir, n8_dir = os.path.join(out, f"{w.name}-cmp"), os.path.join(out, f"{w.name}-n8")
    if not (reuse and finished(cmp_dir, "compare.json")):
        cmd = [MEMDIAG, "compare", "sparse-vs-dense", w.target, "-n", "1,2,4", "--modes", "sparse,dense",
               "--out", cmp_dir, "--force", *(w.memdiag_args if w.builtin else ())]
        run_logged(cmd + (["--", *w.script_args] if w.script_args else []), cmp_dir + ".log")
    if not (reuse and finished(n8_dir, "summary.json")):
        cmd = [MEMDIAG, "run", w.target, "-n", "8", "--mode", "sparse", "--out", n8_dir, "--force",
               *(w.memdiag_args if w.builtin else ())]
        run_logged(cmd + (["--", *w.script_args] if w.script_args else []), n8_dir + ".log")


def recorded_gathered(run_dir: str) -> tuple[int, list[int]]:
    """The most bytes one rank received by allgather of gradients in one training step, and each rank's
    most, summed from its collective records."""
    from memdiag.format.reader import load_run

    run = load_run(run_dir)
    per_rank = []
    for rank in sorted(run.ranks):
        by_step: dict[int, int] = {}
        for c in run.ranks[rank].collectives:
            step = c.get("step")
            if c.get("op") == "allgather" and c.get("gradient") and isinstance(step, int) and step >= 0:
                by_step[step] = by_step.get(step, 0) + int(c["bytes_out"])
        per_rank.append(max(by_step.values(), default=0))
    return max(per_rank, default=0), per_rank


def summary_of(run_dir: str) -> dict[str, Any]:
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        return json.load(f)


def formula_gathered(summary: dict[str, Any]) -> int | None:
    """Sum of summary.json's formula bytes over the gradients gathered (None: one is unknown)."""
    entries = [p for p in summary.get("policy", []) if p.get("decision") != "dense" and "formula_gathered_bytes" in p]
    if any(p["formula_gathered_bytes"] is None for p in entries):
        return None
    return sum(p["formula_gathered_bytes"] for p in entries)


def predicted(cmp_dir: str) -> dict[str, Any]:
    cmd = [MEMDIAG, "predict", cmp_dir, "--ranks", "8", "--modes", "sparse", "--format", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    table = json.loads(done.stdout)
    row = next(r for r in table["rows"] if r["world_size"] == 8 and r["mode"] == "sparse")
    return {**row, "tensor_rows": table.get("tensor_rows"), "not_predicted": table.get("not_predicted"),
            "fitted_from": table.get("fitted_from_world_sizes")}


def sparse_runs(cmp_dir: str) -> list[str]:
    return sorted(os.path.join(cmp_dir, d) for d in os.listdir(cmp_dir)
                  if d.endswith("-sparse") and finished(os.path.join(cmp_dir, d), "summary.json"))


def mib(value: float | None) -> str:
    return "?" if value is None else f"{value / 2**20:.2f}"


def table_row(w: Workload, out: str) -> tuple[list[str], list[str]]:
    cmp_dir, n8_dir = os.path.join(out, f"{w.name}-cmp"), os.path.join(out, f"{w.name}-n8")
    notes: list[str] = []
    runs = (sparse_runs(cmp_dir) if os.path.isdir(cmp_dir) else []) \
        + ([n8_dir] if finished(n8_dir, "summary.json") else [])
    equal = []
    for run_dir in runs:
        got, per_rank = recorded_gathered(run_dir)
        want = formula_gathered(summary_of(run_dir))
        summary = summary_of(run_dir)
        steady = sorted({str(r.get("steady")) for r in summary["ranks"]})
        notes.append(f"{os.path.basename(run_dir)}: records {got} B (per rank {per_rank}), formula {want} B; "
                     f"steady peak {mib(summary.get('steady_peak_rss_bytes_max'))} MiB (steady: {'/'.join(steady)}); "
                     "per-step peak MiB " + ", ".join(mib(st["peak_rss_bytes_max"]) for st in summary["steps_detail"]))
        equal.append(f"{summary['world_size']}:{'=' if got == want else 'NO'}")
        if summary["world_size"] == 1 and not got:
            notes.append("  N=1: no allgather recorded (Horovod's _allreduce_cond reduces only when the process "
                         "set has more than one rank)")
    prediction = predicted(cmp_dir) if finished(cmp_dir, "compare.json") else {"error": "no comparison"}
    if "error" in prediction:
        notes.append(f"predict: {prediction['error']}")
    else:
        notes.append(f"predict: rows {json.dumps(prediction['tensor_rows'])}; not predicted "
                     f"{json.dumps(prediction['not_predicted'])}; regime {prediction['regime']}; "
                     f"fitted from N={prediction['fitted_from']}")
    if finished(n8_dir, "summary.json"):
        s8 = summary_of(n8_dir)
        got8 = recorded_gathered(n8_dir)[0]
        top = max((r for r in s8["ranks"] if r.get("steady_peak_rss_bytes")),
                  key=lambda r: r["steady_peak_rss_bytes"], default=None)
        peak8 = top["steady_peak_rss_bytes"] if top else None
        phase = f"{top['peak_phase']} (rank {top['rank']}, steady {top['steady']})" if top else "?"
        notes.append("n8 steady peaks per rank MiB: "
                     + ", ".join(mib(r.get("steady_peak_rss_bytes")) for r in s8["ranks"]))
    else:
        got8, peak8, phase = None, None, "no N=8 run"
    pred_gathered = prediction.get("gathered_bytes_per_rank")
    pred_peak = prediction.get("peak_rss_bytes")

    def ratio(a: float | None, b: float | None) -> str:
        return "?" if not a or not b else f"{a / b:.3f}"
    cells = [w.name, " ".join(equal), mib(got8), mib(pred_gathered), ratio(pred_gathered, got8),
             mib(peak8), mib(pred_peak), ratio(pred_peak, peak8), phase]
    return cells, notes


HEADER = ["workload", "records=formula by N", "gathered N=8 meas MiB", "pred MiB", "pred/meas",
          "peak N=8 meas MiB", "pred MiB", "pred/meas", "N=8 peak phase"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("runs", "predict-check"))
    parser.add_argument("--only", default="", help="comma-separated workload names")
    parser.add_argument("--reuse", action="store_true", help="keep finished directories; run only what is missing")
    parser.add_argument("--table-only", action="store_true", help="run nothing; read the directories")
    args = parser.parse_args()
    chosen = [w for w in WORKLOADS if not args.only or w.name in args.only.split(",")]
    os.makedirs(args.out, exist_ok=True)
    rows, all_notes = [], []
    for w in chosen:
        if not args.table_only:
            print(f"{w.name}:", file=sys.stderr, flush=True)
            measure(w, args.out, args.reuse)
        cells, notes = table_row(w, args.out)
        rows.append(cells)
        all_notes.append((w.name, notes))
    widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(len(HEADER))]
    for r in [HEADER, *rows]:
        print(" | ".join(c.ljust(width) for c, width in zip(r, widths)))
    for name, notes in all_notes:
        print(f"\n{name}:")
        for n in notes:
            print(f"  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
