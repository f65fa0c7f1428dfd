"""Markdown renderings of a run and of a comparison, for issues and docs."""

from __future__ import annotations

from typing import cast

from memdiag._errors import UserError
from memdiag.format import rundir
from memdiag.format.manifest import RunManifest
from memdiag.format.results import Comparison, EnginesComparison, RunSummary
from memdiag.report.compare import engines_sentence, second_look_outcome
from memdiag.report.reporter import Refusing, RunResult, StudyResult
from memdiag.report.terminal import common_scope, short_name
from memdiag.units import format_bytes


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def run_markdown(summary: RunSummary, manifest: RunManifest) -> str:
    title = f"## {summary.get('workload')} — mode {summary.get('mode')}, {summary.get('world_size')} ranks"
    ranks = _table(
        ["rank", "status", "peak RSS", "VmHWM", "allgather/step", "allreduce/step", "step time"],
        [[str(r["rank"]), r["status"], format_bytes(r["peak_rss_bytes"]), format_bytes(r["hwm_bytes"]),
          format_bytes(r["allgather_bytes_per_step"]), format_bytes(r["allreduce_bytes_per_step"]),
          "-" if r["step_time_s"] is None else f"{r['step_time_s'] * 1000:.1f} ms"] for r in summary["ranks"]],
    )
    scope = common_scope([c["name"] for c in summary["collectives"]])
    tensors = _table(
        ["tensor", "op", "part", "rows in", "rows out", "bytes out per rank", "gradient"],
        [[short_name(c["name"], scope), c["op"], c["part"] or "", str(c["rows_in"]), str(c["rows_out"]),
          format_bytes(c["bytes_out_per_rank"]),
          "densified" if c["densified"] else ("sparse" if c["sparse"] else "dense")]
         for c in summary["collectives"][:20]],
    )
    return f"{title}\n\n{ranks}\n\n{tensors}\n"


def compare_markdown(comparison: Comparison | EnginesComparison) -> str:
    if comparison.get("engine") == "both":
        return engines_markdown(cast(EnginesComparison, comparison))
    result = cast(Comparison, comparison)
    rows = _table(
        ["N", "mode", "peak RSS (max)", "collective bytes/rank/step", "step time", "status"],
        [[str(r["world_size"]), r["mode"], format_bytes(r["steady_peak_rss_bytes_median"]),
          format_bytes(r["collective_bytes_per_rank"]),
          "-" if r["step_time_s"] is None else f"{r['step_time_s'] * 1000:.0f} ms", r["status"]]
         for r in result["rows"]],
    )
    growth = _table(["mode", "peak RSS growth per added rank"],
                    [[m, format_bytes(v)] for m, v in result["growth_bytes_per_rank"].items()])
    c = result["correctness"]
    verdict = f"Correctness passed: {c['passed']} (max abs diff {c['max_abs_diff']}, max rel diff {c['max_rel_diff']})"
    for check in c.get("checks", []):
        again = check.get("rank_order")
        if again:
            verdict += (f"\n\n- N={check['world_size']} {check['mode']} vs {check['against']}: max abs diff "
                        f"{check['max_abs_diff']:.3g} as run, beyond the tolerance; again with MPI's allreduce in "
                        f"rank order (`{again['run']}`): {again['max_abs_diff']:.3g}, "
                        + second_look_outcome(again, check["mode"], check["against"]).strip())
    for note in c.get("notes", []):  # each backed by the comparison's own measurements (analyze.compare)
        verdict += f"\n\n- {note}"
    return f"## compare sparse-vs-dense: {result['workload']}\n\n{rows}\n\n{growth}\n\n{verdict}\n"


def engines_markdown(result: EnginesComparison) -> str:
    """``--engine both``: the verdict, every (N, engine, mode) side by side, correctness per engine."""
    repeated = any(r.get("peak_spread_bytes") is not None for r in result["side_by_side"])
    rows = _table(
        ["N", "engine", "mode", "peak RSS (max)"] + (["spread"] if repeated else [])
        + ["set by", "gathered/rank/step", "formula", "padding", "allreduce/rank/step", "status"],
        [[str(r["world_size"]), r["engine"], r["mode"], format_bytes(r.get("steady_peak_rss_bytes_median"))]
         + ([format_bytes(r.get("peak_spread_bytes"))] if repeated else [])
         + [r.get("peak_phase") or "-", format_bytes(r["gathered_bytes_per_rank"]),
            format_bytes(r.get("predicted_gathered_bytes_per_rank")), format_bytes(r.get("padding_bytes_per_rank")),
            format_bytes(r["allreduce_bytes_per_rank"]), r["status"]]
         for r in result["side_by_side"]],
    )
    c = result["correctness"]
    lines = []
    for engine in result.get("engine_order", []):
        each = result["engines"][engine]["correctness"]
        reduction = each.get("reduction")
        check = (f"reduction check at N={reduction['world_size']} passed: {reduction['passed']}") if reduction else \
            "no reduction check (it needs a rank count above 1)"
        lines.append(f"- {engine}: correctness passed: {each['passed']} (modes against sparse: max abs diff "
                     f"{_num(each['max_abs_diff'])}, max rel diff {_num(each['max_rel_diff'])}); {check}")
    compared = [x for x in c.get("across_engines", []) if x["passed"] is not None]
    if compared:
        worst = max(compared, key=lambda x: x["max_abs_diff"] or 0.0)
        lines.append(f"- across engines (same N and mode): passed: {c['across_engines_passed']} (max abs diff "
                     f"{_num(worst['max_abs_diff'])} at N={worst['world_size']} {worst['mode']}; rtol {c['rtol']:g}, "
                     f"atol {c['atol']:g} and rounding's share of each variable's update)")
    title = f"{result['workload']}" + (f" ({result['preset']})" if result.get("preset") else "")
    return (f"## compare sparse-vs-dense --engine both: {title}\n\n{engines_sentence(result)}\n\n{rows}\n\n"
            + "\n".join(lines) + "\n")


class MarkdownReporter(Refusing):
    name = "markdown"

    def run(self, result: RunResult, output: str | None) -> None:
        print(run_markdown(result.summary, result.run.manifest))

    def study(self, result: StudyResult, output: str | None) -> None:
        if result.kind != rundir.COMPARISON:
            raise UserError(f"--format markdown shows a comparison, not a scaling study ({result.path}): use "
                            "--format text, json or tensorboard, or give one run directory inside it")
        print(compare_markdown(result.document))  # type: ignore[arg-type]  # compare.json, upgraded when read
