"""``memdiag compare --engine both``: Horovod's and MultiWorkerMirroredStrategy's runs side by side.

Run directories are written with memdiag's own record writer and summary, as ``memdiag run`` leaves
them (no MPI, no mocks): one IndexedSlices embedding gradient and one dense kernel, Horovod's records
as its hooks write them, MWMS's with the row-count gather, the padded values and indices gathers and
every worker's rows in the policy record. Every expected figure is worked out here by hand from the
shapes chosen below, not by the code under test.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from memdiag.analyze import compare as comparison
from memdiag.analyze.engines import build_engines
from memdiag.analyze.summary import summarize
from memdiag.cli import main
from memdiag.format import rundir
from memdiag.format.reader import load_run
from memdiag.format.rundir import compare_run_name, runs_of, verify_run_name
from memdiag.format.writer import RecordWriter
from memdiag.report.compare import print_compare
from memdiag.units import format_bytes

MiB = 2**20
EMB = "transformer/encoder/source_embedding/embeddings:0"
KERNEL = "transformer/decoder/output_dense/kernel:0"
ROWS, WIDTH, VOCAB = 256, 32, 1024  # the tiny preset's rows per rank and width; a larger vocabulary
ROW_BYTES, INDEX_BYTES, COUNT_BYTES = 4 * WIDTH, 8, 4  # float32 rows, int64 indices, int32 row counts
KERNEL_BYTES = 4 * WIDTH * WIDTH
HVD, TFD = "horovod", "tf-distribute"
RANKS, MODES, STEPS = (1, 2, 4), ("sparse", "dense"), 3
NOISE = 10 * MiB  # every run's ranks differ by this: the noise floor of runs without repeats
# The largest per-rank steady peak (MiB) of each run; the other ranks peak NOISE lower.
PEAKS = {
    (1, HVD, "sparse"): 800, (1, HVD, "dense"): 805, (1, TFD, "sparse"): 810, (1, TFD, "dense"): 812,
    (2, HVD, "sparse"): 900, (2, HVD, "dense"): 880, (2, TFD, "sparse"): 910, (2, TFD, "dense"): 890,
    (4, HVD, "sparse"): 1100, (4, HVD, "dense"): 900, (4, TFD, "sparse"): 1130, (4, TFD, "dense"): 950,
}
INITIAL = np.linspace(0.0, 1.0, 16, dtype=np.float32)
FINAL = INITIAL + np.float32(0.01)  # every run moves the kernel by 0.01


def rows_of(n: int, engine: str, uneven: bool) -> list[int]:
    """Every worker's rows: the workload's 256 each, or (MWMS, uneven) 256 + 64 x worker."""
    return [ROWS + (64 * r if uneven and engine == TFD else 0) for r in range(n)]


def write_run(path: Path, n: int, engine: str, mode: str, peak_mib: int, uneven: bool = False,
              params_offset: float = 0.0) -> str:
    """One run directory: run.json, rank-K.jsonl, params, summary.json."""
    path.mkdir(parents=True)
    manifest = {"workload": "transformer", "preset": "tiny", "mode": mode, "world_size": n, "steps": STEPS,
                "status": "ok", "engine": engine}
    (path / "run.json").write_text(json.dumps(manifest))
    rows = rows_of(n, engine, uneven)
    most = max(rows)
    dense = mode == "dense"
    for rank in range(n):
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        writer.add({"type": "start", "t": 1.0, "size": n, "host": "h", "versions": {"tensorflow": "2.15.1"}})
        policy = {"type": "policy", "t": 1.5, "step": -1, "name": EMB, "mode": mode,
                  "decision": "dense" if dense else "sparse", "reason": f"mode {mode}", "world_size": n,
                  "local_rows": rows[rank], "agreed_rows": most, "row_bytes": ROW_BYTES,
                  "index_bytes": INDEX_BYTES, "dense_rows": VOCAB, "row_elements": WIDTH,
                  "dense_bytes": VOCAB * ROW_BYTES}
        if engine == TFD:
            policy.update(rows_per_worker=rows, rows_total=sum(rows))
        writer.add(policy)
        peak = peak_mib * MiB - (NOISE if rank else 0)
        for step in range(STEPS):
            t0 = 10.0 * (step + 1)
            for record in collectives(n, engine, dense, rows, rank) if n > 1 else []:
                writer.add({"type": "collective", "t": t0 + 6, "step": step, "dtype": "float32", "gradient": True,
                            "grouped": False, "reduce_op": "sum" if engine == TFD else "average", **record})
            writer.add({"type": "mem", "t": t0 + 8, "step": step, "times": [t0 + 1, t0 + 5.5, t0 + 7.5],
                        "rss": [peak, peak, peak]})
            writer.add({"type": "step", "t": t0 + 8, "step": step, "t_start": t0, "t_end": t0 + 8, "step_time_s": 8.0,
                        "peak_rss_bytes": peak, "hwm_bytes": peak, "window_start": t0 + 5, "window_end": t0 + 7,
                        "loss": 5.0 - step, "items": ROWS, "param_digest": f"d{step}"})
        writer.add({"type": "end", "t": 50.0, "status": "ok", "error": None, "hwm_bytes": peak})
        writer.close()
    # the offset moves the kernel only: the table ends where it ends on the other engine
    np.savez(path / "params_initial.npz", **{"0000:" + KERNEL: INITIAL, "0001:" + EMB: INITIAL})
    np.savez(path / "params.npz", **{"0000:" + KERNEL: FINAL + np.float32(params_offset), "0001:" + EMB: FINAL})
    (path / "summary.json").write_text(json.dumps(summarize(load_run(str(path))), default=str))
    return str(path)


def collectives(n: int, engine: str, dense: bool, rows: list[int], rank: int) -> list[dict]:
    """One step's collectives on one rank, as each engine's hooks record them."""
    kernel = {"op": "allreduce", "name": KERNEL, "part": None, "shape_in": [WIDTH, WIDTH],
              "shape_out": [WIDTH, WIDTH], "bytes_in": KERNEL_BYTES, "bytes_out": KERNEL_BYTES,
              "sparse": False, "densified": False}
    if dense:
        table = {"op": "allreduce", "name": EMB, "part": None, "shape_in": [VOCAB, WIDTH], "shape_out": [VOCAB, WIDTH],
                 "bytes_in": VOCAB * ROW_BYTES, "bytes_out": VOCAB * ROW_BYTES, "sparse": True, "densified": True}
        return [table, kernel]
    if engine == HVD:
        # Horovod gathers every rank's own rows (no padding)
        total = sum(rows)
        return [{"op": "allgather", "name": EMB, "part": "values", "shape_in": [rows[rank], WIDTH],
                 "shape_out": [total, WIDTH], "bytes_in": rows[rank] * ROW_BYTES, "bytes_out": total * ROW_BYTES,
                 "sparse": True, "densified": False},
                {"op": "allgather", "name": EMB, "part": "indices", "shape_in": [rows[rank]], "shape_out": [total],
                 "bytes_in": rows[rank] * INDEX_BYTES, "bytes_out": total * INDEX_BYTES, "sparse": True,
                 "densified": False, "dtype": "int64"},
                kernel]
    # MWMS: the row counts, then values and indices padded to the longest worker's rows
    most, total = max(rows), sum(rows)
    mwms = {"engine": TFD, "sparse": True, "densified": False}
    padded = {"padded": most != min(rows), "rows": rows[rank], "rows_total": total}
    return [{"op": "allgather", "name": EMB, "part": "lengths", "stage": "lengths", "shape_in": [1], "shape_out": [n],
             "bytes_in": COUNT_BYTES, "bytes_out": n * COUNT_BYTES, "dtype": "int32", **mwms},
            {"op": "allgather", "name": EMB, "part": "values", "stage": "values", "shape_in": [most, WIDTH],
             "shape_out": [n * most, WIDTH], "bytes_in": most * ROW_BYTES, "bytes_out": n * most * ROW_BYTES,
             "pad_in_bytes": (most - rows[rank]) * ROW_BYTES, "pad_out_bytes": (n * most - total) * ROW_BYTES,
             **padded, **mwms},
            {"op": "allgather", "name": EMB, "part": "indices", "stage": "indices", "shape_in": [most],
             "shape_out": [n * most], "bytes_in": most * INDEX_BYTES, "bytes_out": n * most * INDEX_BYTES,
             "pad_in_bytes": (most - rows[rank]) * INDEX_BYTES, "pad_out_bytes": (n * most - total) * INDEX_BYTES,
             "dtype": "int64", **padded, **mwms},
            {**kernel, "engine": TFD, "stage": "pack"}]


def write_verify(path: Path, ratio: float = 0.1, engine: str = HVD) -> str:
    """An engine's verification run at N=2: one reduction check record per rank (MWMS sums)."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"workload": "transformer", "preset": "tiny", "mode": "sparse",
                                               "world_size": 2, "steps": 1, "status": "ok"}))
    for rank in range(2):
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        writer.add({"type": "start", "t": 1.0, "size": 2, "host": "h"})
        mwms = {"engine": TFD} if engine == TFD else {}
        writer.add({"type": "reduction_check", "t": 2.0, "step": 0, "name": EMB, "against": "dense",
                    "reduce_op": "sum" if mwms else "average", "compression": None if mwms else "none",
                    "max_abs_diff": 1e-9, "max_rel_diff": 1e-8, "rounding_bound_ratio": ratio,
                    "terms_max": 2 * ROWS, **mwms})
        writer.add({"type": "end", "t": 3.0, "status": "ok", "error": None, "hwm_bytes": 1})
        writer.close()
    (path / "summary.json").write_text(json.dumps(summarize(load_run(str(path))), default=str))
    return str(path)


def write_comparison(root: Path, peaks: dict | None = None, uneven: bool = False,
                     tfd_params_offset: float = 0.0, tfd_ratio: float = 0.2) -> dict:
    """A comparison directory as `memdiag compare --engine both` leaves it; returns its compare.json."""
    peaks = {**PEAKS, **(peaks or {})}
    run_dirs: dict[str, dict] = {HVD: {}, TFD: {}}
    for n in RANKS:
        for engine in (HVD, TFD):
            for mode in MODES:
                name = compare_run_name(n, mode, 0, engine == TFD)
                run_dirs[engine][(n, mode)] = [write_run(root / name, n, engine, mode, peaks[(n, engine, mode)],
                                                         uneven, tfd_params_offset if engine == TFD else 0.0)]
    verify = {HVD: write_verify(root / verify_run_name(2)),
              TFD: write_verify(root / verify_run_name(2, True), tfd_ratio, TFD)}
    result = build_engines("transformer", "tiny", run_dirs, verify)
    study = {"rank_counts": list(RANKS), "modes": list(MODES), "steps": STEPS, "repeats": 1, "directory": str(root)}
    for each in result["engines"].values():
        each.update(study)
    result.update(study)
    rundir.write_comparison(str(root), result)
    return json.loads((root / "compare.json").read_text())


def render(result: dict, width: int = 80) -> str:
    out = io.StringIO()
    print_compare(result, Console(width=width, file=out, force_terminal=True, color_system=None))
    return out.getvalue()


def flat(text: str) -> str:
    """The text with its line breaks and runs of spaces made single spaces: what a wrapped line says."""
    return " ".join(text.split())


def table_rows(text: str, title: str) -> dict[tuple[str, str, str], list[str]]:
    """The cells of the table under ``title``, by (N, engine, mode)."""
    rows: dict[tuple[str, str, str], list[str]] = {}
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    for line in lines[start + 1:]:
        if not line.startswith(("│", "┏", "┃", "┡", "├", "└", "━", "─")):
            break
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            rows[(cells[0], cells[1], cells[2])] = cells[3:]
    return rows


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("compare-both")
    return root, write_comparison(root)


def row(result: dict, n: int, engine: str, mode: str) -> dict:
    [found] = [r for r in result["side_by_side"] if (r["world_size"], r["engine"], r["mode"]) == (n, engine, mode)]
    return found


# -- the side-by-side rows -----------------------------------------------------------------------------

def test_every_engine_rank_count_and_mode_has_a_row_with_its_steady_peak(both):
    _, result = both
    assert result["engine"] == "both" and result["engine_order"] == [HVD, TFD]
    keys = [(r["world_size"], r["engine"], r["mode"]) for r in result["side_by_side"]]
    assert keys == [(n, e, m) for n in RANKS for e in (HVD, TFD) for m in sorted(MODES)]
    for (n, engine, mode), peak in PEAKS.items():
        assert row(result, n, engine, mode)["steady_peak_rss_bytes_median"] == peak * MiB
    # each engine's own comparison is there too, from its own runs
    assert set(result["engines"]) == {HVD, TFD}
    assert {r["run_dir"] for r in result["engines"][TFD]["rows"]} == {f"tfd-n{n}-{m}" for n in RANKS for m in MODES}
    assert {r["run_dir"] for r in result["engines"][HVD]["rows"]} == {f"n{n}-{m}" for n in RANKS for m in MODES}


def test_gathered_bytes_padding_and_the_formula_are_the_figures_worked_out_by_hand(both):
    _, result = both
    for n in (2, 4):
        gathered = n * ROWS * (ROW_BYTES + INDEX_BYTES)  # 2: 69,632 B; 4: 139,264 B
        horovod = row(result, n, HVD, "sparse")
        assert horovod["gathered_bytes_per_rank"] == horovod["predicted_gathered_bytes_per_rank"] == gathered
        assert horovod["padding_bytes_per_rank"] is None and horovod["lengths_bytes_per_rank"] == 0
        mwms = row(result, n, TFD, "sparse")
        assert mwms["gathered_bytes_per_rank"] == mwms["predicted_gathered_bytes_per_rank"] == gathered
        assert mwms["lengths_bytes_per_rank"] == n * COUNT_BYTES  # measured apart from the rows
        assert mwms["padding_bytes_per_rank"] == mwms["predicted_padding_bytes_per_rank"] == 0  # equal rows
        for engine in (HVD, TFD):
            assert row(result, n, engine, "sparse")["allreduce_bytes_per_rank"] == KERNEL_BYTES
            densified = row(result, n, engine, "dense")
            assert densified["gathered_bytes_per_rank"] == densified["predicted_gathered_bytes_per_rank"] == 0
            assert densified["allreduce_bytes_per_rank"] == VOCAB * ROW_BYTES + KERNEL_BYTES  # 135,168 B
    # one rank runs no collective, and the formula says so
    for engine in (HVD, TFD):
        alone = row(result, 1, engine, "sparse")
        assert alone["gathered_bytes_per_rank"] == alone["predicted_gathered_bytes_per_rank"] == 0
    assert result["verdict"]["formula_exact"] == {HVD: True, TFD: True}


def test_uneven_rows_are_padded_by_mwms_and_its_padding_is_the_formulas(tmp_path):
    result = write_comparison(tmp_path, uneven=True)
    # at N=4 the workers have 256, 320, 384, 448 rows: MWMS gathers 4 x 448 rows, 384 of them zero rows
    mwms = row(result, 4, TFD, "sparse")
    assert mwms["gathered_bytes_per_rank"] == mwms["predicted_gathered_bytes_per_rank"] == 4 * 448 * 136 == 243_712
    assert mwms["padding_bytes_per_rank"] == mwms["predicted_padding_bytes_per_rank"] == 384 * 136 == 52_224
    v = result["verdict"]
    assert v["padding_bytes"] == 52_224 and v["equal_rows"] is False
    assert v["rows_per_worker"] == {EMB: [256, 320, 384, 448]}
    assert v["gathered_ratio"] == pytest.approx(243_712 / (4 * ROWS * 136))  # 1.75
    assert "51 KiB of tf-distribute's was padding" in flat(render(result))


# -- the verdict -----------------------------------------------------------------------------------------

def test_the_verdict_names_the_lowest_reduction_its_lead_and_that_it_is_beyond_the_noise(both):
    _, result = both
    v = result["verdict"]
    assert v["world_size"] == 4 and v["noise_bytes"] == NOISE and v["noise_source"] == "ranks"
    assert [(p["engine"], p["mode"]) for p in v["peaks"]] == [(HVD, "dense"), (TFD, "dense"), (HVD, "sparse"),
                                                              (TFD, "sparse")]
    assert v["lead_bytes"] == 50 * MiB and v["lead_beyond_noise"] is True
    first = render(result).splitlines()[0]
    assert first.startswith("At N=4 the lowest per-rank peak is horovod dense, 900 MiB, 50 MiB below")
    text = flat(render(result))
    assert ("At N=4 the lowest per-rank peak is horovod dense, 900 MiB, 50 MiB below tf-distribute dense, beyond "
            "the noise (10 MiB); then horovod sparse 1.07 GiB, tf-distribute sparse 1.1 GiB.") in text
    assert ("In mode sparse tf-distribute gathered 136 KiB per rank per step, horovod 136 KiB (1.00x); "
            "tf-distribute's padding was 0 B because every worker had the same rows (256 per tensor).") in text
    assert "Gathered bytes equal the formula's on horovod and tf-distribute." in text
    # the engines' own lowest peaks: MWMS's dense 950 MiB against Horovod's dense 900 MiB
    assert v["engine_gap_bytes"] == 50 * MiB and v["engine_gap_beyond_noise"] is True
    assert "The lowest of tf-distribute (dense, 950 MiB) is 50 MiB above the lowest of horovod, beyond the noise." \
        in text


def test_a_lead_no_larger_than_the_noise_is_called_within_noise(tmp_path):
    result = write_comparison(tmp_path, peaks={(4, TFD, "dense"): 905})
    assert result["verdict"]["lead_bytes"] == 5 * MiB and result["verdict"]["lead_beyond_noise"] is False
    text = flat(render(result))
    assert "5 MiB below tf-distribute dense, within noise (10 MiB): level" in text
    assert result["verdict"]["engine_gap_beyond_noise"] is False
    assert "The lowest of tf-distribute (dense, 905 MiB) is 5 MiB above the lowest of horovod, within noise." in text


# -- correctness -----------------------------------------------------------------------------------------

def test_each_engine_is_checked_by_its_parameters_and_by_its_own_reduction_check(both):
    _, result = both
    c = result["correctness"]
    assert c["passed"] is True and c["by_engine"] == {HVD: True, TFD: True}
    assert c["reduction_checked"] == [HVD, TFD]
    assert result["engines"][HVD]["correctness"]["reduction"]["passed"] is True
    tfd = result["engines"][TFD]["correctness"]["reduction"]
    assert tfd["passed"] is True and tfd["reduce_ops"] == ["sum"] and tfd["rounding_bound_ratio"] == 0.2
    text = flat(render(result))
    assert text.count("reduction check at N=2: allgather and dense allreduce") == 2
    assert "0.2 of float rounding's bound" in text
    assert "no reduction check" not in text and "Horovod only" not in text
    # same N and mode across engines: equal parameters and losses here
    assert {(x["world_size"], x["mode"]) for x in c["across_engines"]} == {(n, m) for n in RANKS for m in MODES}
    assert c["across_engines_passed"] is True and all(x["max_abs_diff"] == 0 for x in c["across_engines"])
    assert "Across engines PASSED: final parameters of tf-distribute against horovod, same N and mode (6 pair(s))" \
        in text


def test_parameters_that_differ_between_engines_beyond_rounding_fail_the_comparison(tmp_path):
    # GIVEN MWMS runs whose kernel ends 1e-3 away from Horovod's (an update of 0.01 in every run)
    result = write_comparison(tmp_path, tfd_params_offset=1e-3)
    # THEN the parameters across engines fail, and with them the comparison; each engine alone passes
    c = result["correctness"]
    assert c["across_engines_passed"] is False and c["passed"] is False
    assert c["by_engine"] == {HVD: True, TFD: True}
    assert max(x["max_abs_diff"] for x in c["across_engines"]) == pytest.approx(1e-3, rel=1e-3)
    assert {x["worst_variable"] for x in c["across_engines"] if x["world_size"] > 1} == {KERNEL}
    assert "Across engines FAILED" in render(result)


def test_parameters_a_hair_apart_pass_within_the_stated_tolerance(tmp_path):
    result = write_comparison(tmp_path, tfd_params_offset=2e-7)  # float32 rounding near 1.0 is 6e-8
    c = result["correctness"]
    assert c["across_engines_passed"] is True
    assert 0 < max(x["max_abs_diff"] for x in c["across_engines"]) < 1e-6


# -- rendering -------------------------------------------------------------------------------------------

def test_the_report_fits_80_columns_without_cutting_a_figure_an_engine_or_a_mode(both):
    _, result = both
    text = render(result)
    too_long = [line for line in text.splitlines() if len(line) > 80]
    assert not too_long, "\n".join(too_long)
    peaks = table_rows(text, "Per-rank steady peak")
    bytes_ = table_rows(text, "Bytes per rank per step")
    for r in result["side_by_side"]:
        key = (str(r["world_size"]), r["engine"], r["mode"])
        assert peaks[key][0] == format_bytes(r["steady_peak_rss_bytes_median"]) and peaks[key][-1] == "ok"
        assert bytes_[key] == [format_bytes(r["gathered_bytes_per_rank"]),
                               format_bytes(r["predicted_gathered_bytes_per_rank"]),
                               format_bytes(r["padding_bytes_per_rank"]), format_bytes(r["allreduce_bytes_per_rank"])]
    assert bytes_[("4", TFD, "sparse")] == ["136 KiB", "136 KiB", "0 B", "4 KiB"]
    assert bytes_[("4", HVD, "sparse")] == ["136 KiB", "136 KiB", "-", "4 KiB"]
    assert bytes_[("4", HVD, "dense")] == ["0 B", "0 B", "-", "132 KiB"]


def test_memdiag_report_rerenders_text_json_and_markdown_from_the_directory_alone(both, capsys, monkeypatch):
    root, result = both
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["report", str(root)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("At N=4 the lowest per-rank peak is horovod dense")
    assert flat(text) == flat(render(result))
    assert main(["report", str(root), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == result
    assert main(["report", str(root), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("## compare sparse-vs-dense --engine both: transformer (tiny)")
    assert "| 4 | tf-distribute | sparse | 1.1 GiB |" in md and "| 136 KiB | 136 KiB | 0 B | 4 KiB | ok |" in md
    assert "horovod dense, 900 MiB, 50 MiB below tf-distribute dense, beyond the noise" in md
    assert md.count("reduction check at N=2 passed: True") == 2 and "no reduction check" not in md


def test_a_tf_distribute_comparison_alone_names_its_engine_and_has_no_reduction_check(tmp_path):
    run_dirs = {(n, mode): write_run(tmp_path / compare_run_name(n, mode, 0, True), n, TFD, mode,
                                     PEAKS[(n, TFD, mode)]) for n in RANKS for mode in MODES}
    result = {**comparison.build("transformer", "tiny", run_dirs), "engine": TFD, "modes": list(MODES),
              "rank_counts": list(RANKS), "steps": STEPS}
    text = flat(render(result))
    assert "engine tf-distribute" in text and "Correctness PASSED" in text
    assert "no reduction check (it needs a rank count above 1), so tf-distribute's modes are checked by their " \
           "final parameters only" in text
    # Horovod's comparison names no engine (its compare.json is as before) and its report says nothing of it
    horovod = comparison.build("transformer", "tiny", {(2, "sparse"): run_dirs[(2, "sparse")]})
    assert "engine" not in horovod and "no reduction check" not in flat(render({**horovod, "modes": ["sparse"]}))


def test_a_comparisons_run_directories_show_the_engine_and_keep_horovods_names():
    assert compare_run_name(4, "sparse") == "n4-sparse"
    assert compare_run_name(4, "dense", 1) == "n4-dense-r2"
    assert compare_run_name(2, "sparse", 0, tf_distribute=True) == "tfd-n2-sparse"
    assert compare_run_name(2, "auto", 2, tf_distribute=True) == "tfd-n2-auto-r3"
    assert verify_run_name(2) == "verify-n2" and verify_run_name(4, True) == "tfd-verify-n4"


def test_both_verification_runs_are_left_out_of_the_measured_runs(tmp_path):
    write_comparison(tmp_path)
    names = {Path(p).name for p in runs_of(str(tmp_path))}
    assert "verify-n2" not in names and "tfd-verify-n2" not in names and "tfd-n2-sparse" in names


def test_a_tf_distribute_reduction_beyond_rounding_fails_its_engine_only(tmp_path):
    result = write_comparison(tmp_path, tfd_ratio=3.0)
    assert result["engines"][TFD]["correctness"]["reduction"]["passed"] is False
    assert result["engines"][HVD]["correctness"]["reduction"]["passed"] is True
    assert result["correctness"]["by_engine"][TFD] is False and result["correctness"]["passed"] is False
    assert "3 of float rounding's bound" in flat(render(result))


# -- bad input ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needles", [
    (["examples/user_mwms_embedding.py", "--engine", "both"], ["--engine both compares a built-in workload",
                                                               "--engine horovod or --engine tf-distribute"]),
    (["transformer", "--engine", "both", "--modes", "sparse,dedup"], ["not dedup", "use --engine horovod"]),
    (["transformer", "--engine", "both", "--modes", "as-written"], ["not as-written"]),
    (["transformer", "--engine", "nccl"], ["--engine 'nccl'", "horovod, tf-distribute, both"]),
])
def test_bad_input_is_one_line_exit_2_and_leaves_no_directory(args, needles, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # No mpirun on PATH: should a check be missed, the run fails to start (and the test with it) rather
    # than starting ranks.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["compare", "sparse-vs-dense", *args, "-n", "1,2"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()
