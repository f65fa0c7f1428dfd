"""The live model's two bounds: one gathered tensor's outputs and quotient at a time, and every one's at once.

A comparison of two averaged embedding tables (A: 5000 rows a rank, B: 3000, both 1024 float32 wide) at N = 2,
4, 8, written as rank records with memdiag's own writer and read back by its summary, comparison and report.
The expected bounds are computed here from the shapes alone: at a time, A's gathered values and indices and
A's quotient (the larger tensor); at once, both tables' gathered values, indices and quotients.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from memdiag.analyze import compare as compare_analysis
from memdiag.analyze.collective_table import collective_log
from memdiag.analyze.live_bytes import live_steps
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
from memdiag.format.writer import RecordWriter
from memdiag.formula import SparseGradientShape
from memdiag.policy import decide
from memdiag.report.compare import live_bounds_text, print_compare
from memdiag.units import format_bytes

MiB, GiB = 2**20, 2**30
WIDTH, ROW_BYTES, INDEX_BYTES = 1024, 4 * 1024, 4
TABLES = {"model/a/embeddings:0": 5000, "model/b/embeddings:0": 3000}  # rows per rank and step
KERNEL = "model/dense/kernel:0"
KERNEL_BYTES = 4 * WIDTH * WIDTH
RANK_COUNTS, STEPS = (2, 4, 8), 3
BASE = 800 * MiB  # what a step holds besides the gathered buffers
VOCAB = 50000


def one_at_a_time(n: int) -> int:
    """A's gathered values and indices, A's quotient (its values again), and the dense kernel."""
    rows = TABLES["model/a/embeddings:0"]
    return n * rows * (ROW_BYTES + INDEX_BYTES) + n * rows * ROW_BYTES + KERNEL_BYTES


def all_at_once(n: int) -> int:
    """Both tables' gathered values, indices and quotients, and the dense kernel."""
    rows = sum(TABLES.values())
    return n * rows * (ROW_BYTES + INDEX_BYTES) + n * rows * ROW_BYTES + KERNEL_BYTES


def write_run(path: Path, n: int, peak: int) -> Path:
    """A sparse run directory as `memdiag run` leaves it, every rank peaking at ``peak`` in every step."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"workload": "synthetic", "preset": "two-tables", "mode": "sparse",
                                               "world_size": n, "steps": STEPS, "status": "ok"}))
    common = {"type": "collective", "grouped": False, "gradient": True, "reduce_op": "average",
              "process_set_size": n, "densified": False}
    for rank in range(n):
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        writer.add({"type": "start", "t": 1.0, "size": n, "host": "h", "versions": {"tensorflow": "2.15.1"}})
        for name, rows in TABLES.items():  # the shapes known before the run, as the hooks record them
            shape = SparseGradientShape(rows, ROW_BYTES, INDEX_BYTES, VOCAB, WIDTH)
            writer.add({**decide("sparse", name, n, shape).as_record(), "t": 1.5})
        for step in range(STEPS):
            t0 = 10.0 * (step + 1)
            for i, (name, rows) in enumerate(TABLES.items()):
                t = t0 + 5 + i
                writer.add({**common, "t": t, "step": step, "op": "allgather", "name": name, "part": "values",
                            "dtype": "float32", "sparse": True, "shape_in": [rows, WIDTH],
                            "shape_out": [n * rows, WIDTH], "bytes_in": rows * ROW_BYTES,
                            "bytes_out": n * rows * ROW_BYTES})
                writer.add({**common, "t": t, "step": step, "op": "allgather", "name": name, "part": "indices",
                            "dtype": "int32", "sparse": True, "shape_in": [rows], "shape_out": [n * rows],
                            "bytes_in": rows * INDEX_BYTES, "bytes_out": n * rows * INDEX_BYTES})
            writer.add({**common, "t": t0 + 7, "step": step, "op": "allreduce", "name": KERNEL, "part": None,
                        "dtype": "float32", "sparse": False, "shape_in": [WIDTH, WIDTH], "shape_out": [WIDTH, WIDTH],
                        "bytes_in": KERNEL_BYTES, "bytes_out": KERNEL_BYTES})
            times = [t0 + 1, t0 + 3, t0 + 5.5, t0 + 7.5]
            rss = [BASE - 100 * MiB, BASE, peak, peak]
            writer.add({"type": "mem", "t": t0 + 8, "step": step, "times": times, "rss": rss})
            writer.add({"type": "step", "t": t0 + 8, "step": step, "t_start": t0, "t_end": t0 + 8,
                        "step_time_s": 8.0, "peak_rss_bytes": peak, "sampled_peak_rss_bytes": peak,
                        "hwm_bytes": peak, "window_start": t0 + 5, "window_end": t0 + 8, "loss": 5.0 - step,
                        "items": 10, "param_digest": f"d{step}"})
        writer.add({"type": "end", "t": 50.0, "status": "ok", "error": None, "hwm_bytes": peak})
        writer.close()
    (path / "summary.json").write_text(json.dumps(summarize(load_run(str(path))), default=str))
    return path


def comparison(root: Path, peaks: dict[int, int]) -> dict:
    run_dirs = {(n, "sparse"): str(write_run(root / f"n{n}-sparse", n, peaks[n])) for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=1)
    return json.loads(json.dumps(result, default=str))


def words(result: dict) -> str:
    console = Console(record=True, width=100, file=io.StringIO(), color_system=None)
    print_compare(result, console)
    return " ".join(console.export_text().replace("│", " ").split())


def test_a_step_of_two_gathered_tables_has_one_at_a_time_and_all_at_once_bounds(tmp_path):
    # GIVEN one rank's records of two averaged tables and a dense kernel at N=4
    run = write_run(tmp_path / "n4", 4, GiB)
    records = load_run(str(run)).ranks[0]
    steps, _ = live_steps(collective_log(records.collectives))
    # THEN every step's two bounds are the shapes' by hand, the second larger by B's gathered buffers
    assert sorted(steps) == list(range(STEPS))
    for live in steps.values():
        assert live.live_bytes == one_at_a_time(4)
        assert live.all_at_once_bytes == all_at_once(4)
    # AND the run's summary carries both, the largest over its ranks
    summary = json.loads((run / "summary.json").read_text())
    assert summary["collective_live_peak_bytes_max"] == one_at_a_time(4)
    assert summary["collective_live_all_peak_bytes_max"] == all_at_once(4)


def test_one_gathered_table_has_one_bound(tmp_path):
    # GIVEN a run of one table (B's records dropped)
    run = write_run(tmp_path / "n2", 2, GiB)
    for path in run.glob("rank-*.jsonl"):
        lines = [line for line in path.read_text().splitlines() if "model/b/" not in line]
        path.write_text("\n".join(lines) + "\n")
    steps, _ = live_steps(collective_log(load_run(str(run)).ranks[0].collectives))
    # THEN at a time and at once are the same bytes
    assert {(s.live_bytes, s.all_at_once_bytes) for s in steps.values()} == {(one_at_a_time(2), one_at_a_time(2))}


def test_a_growth_between_the_bounds_is_said_to_lie_between_them_per_segment_too(tmp_path):
    # GIVEN sparse peaks that grow by halfway between the two bounds per added rank
    lower = one_at_a_time(1) - KERNEL_BYTES  # per added rank
    upper = all_at_once(1) - KERNEL_BYTES
    halfway = (lower + upper) // 2
    result = comparison(tmp_path, {n: BASE + n * halfway for n in RANK_COUNTS})
    physics = result["physics"]
    # THEN the comparison carries both bounds' growth per added rank, by hand
    assert physics["sparse_growth_bytes_per_rank"] == pytest.approx(halfway)
    assert physics["sparse_live_growth_bytes_per_rank"] == pytest.approx(lower)
    assert physics["sparse_live_all_growth_bytes_per_rank"] == pytest.approx(upper)
    # AND each segment has them too
    for segment in physics["sparse_segments"]:
        assert segment["live_bytes_per_rank"] == pytest.approx(lower)
        assert segment["live_all_bytes_per_rank"] == pytest.approx(upper)
    # AND the verdict says where the measured growth lies, in the headline and in each segment
    text = words(result)
    assert "with every gathered tensor's outputs and quotient alive at once: the measured growth lies between the two" \
        in text
    assert text.count("the measured growth lies between the two") == 1 + len(physics["sparse_segments"])


def test_a_growth_above_both_bounds_is_said_to_be_above_both(tmp_path):
    upper = all_at_once(1) - KERNEL_BYTES
    result = comparison(tmp_path, {n: BASE + n * (upper + 20 * MiB) for n in RANK_COUNTS})
    text = words(result)
    assert "the measured growth is above both" in text and "lies between" not in text


def test_the_bounds_clause_in_words():
    assert live_bounds_text(90 * MiB, 64 * MiB, 128 * MiB).endswith("lies between the two, as when the tensors' "
                                                                   "reductions overlap in part")
    assert live_bounds_text(60 * MiB, 64 * MiB, 128 * MiB).endswith("below both")
    assert live_bounds_text(90 * MiB, 64 * MiB, 64 * MiB) == ""  # one gathered tensor: no other bound
    assert live_bounds_text(90 * MiB, 64 * MiB, None) == ""  # a comparison written before the bound


def test_predict_gives_the_peak_with_every_table_at_once_on_the_same_base(tmp_path, capsys):
    from memdiag.cli import main

    # GIVEN the two-table comparison, its peaks growing by the one-at-a-time figure, written as compare leaves it
    lower = one_at_a_time(1) - KERNEL_BYTES  # per added rank: A's gathered rows and A's quotient
    upper = all_at_once(1) - KERNEL_BYTES  # both tables'
    peaks = {n: BASE + n * lower for n in RANK_COUNTS}
    result = comparison(tmp_path, peaks)
    (tmp_path / "compare.json").write_text(json.dumps(result))
    # WHEN memdiag predicts N=16
    assert main(["predict", str(tmp_path), "--ranks", "16", "--modes", "sparse", "--format", "json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["rows"]
    # THEN the peak is the base anchored at N=8 plus one table's buffers at a time, and the other figure the
    # same base plus both tables' at once (by hand from the shapes: the base is what N=8 held less A's buffers)
    base = peaks[8] - 8 * lower
    assert row["peak_rss_bytes"] == pytest.approx(base + 16 * lower)
    assert row["peak_rss_all_at_once_bytes"] == pytest.approx(base + 16 * upper)
    # AND the text report has the column and says what it is
    assert main(["predict", str(tmp_path), "--ranks", "16", "--modes", "sparse"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "all at once" in text and "an upper figure" in text


def repeated_comparison(root: Path, peaks: dict[int, int]) -> dict:
    """The comparison with every configuration measured twice, alike (run-to-run noise 0)."""
    run_dirs = {(n, "sparse"): str(write_run(root / f"n{n}-sparse", n, peaks[n])) for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", {key: [path, path] for key, path in run_dirs.items()})
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=2)
    return json.loads(json.dumps(result, default=str))


def test_with_repeats_a_gap_the_all_at_once_figure_covers_is_not_called_unexplained(tmp_path):
    # GIVEN repeats (noise 0), and a growth from N=4 to 8 between the two figures, while from 2 to 4 it is above both
    lower = one_at_a_time(1) - KERNEL_BYTES
    upper = all_at_once(1) - KERNEL_BYTES
    halfway = (lower + upper) // 2
    peaks = {2: BASE + 2 * halfway, 4: BASE + 2 * halfway + 2 * (upper + 20 * MiB)}
    peaks[8] = peaks[4] + 4 * halfway
    result = repeated_comparison(tmp_path, peaks)
    assert result["noise_source"] == "repeats" and result["noise_bytes"] == 0
    first, second = result["physics"]["sparse_segments"]
    assert first["beyond_noise"] is True and second["beyond_noise"] is True
    text = words(result)
    # THEN the segment above both is unexplained, and the one between the figures is not
    assert "N=2 to 4:" in text and "unexplained: " in text
    [between] = [part for part in text.split("; N=") if part.startswith("4 to 8")]
    assert "unexplained" not in between and "beyond two standard errors of the repeats" in between
    assert "the measured growth lies between the two" in between
    above = text.split("N=2 to 4:")[1].split("; N=4 to 8")[0]
    assert "unexplained: " in above and "the measured growth is above both" in above


def test_a_run_whose_gathered_buffers_set_the_peak_names_both_figures(tmp_path):
    from memdiag.report.terminal import peak_cause

    # GIVEN the two-table run at N=4, its peak the base plus halfway between the figures
    lower, upper = one_at_a_time(1) - KERNEL_BYTES, all_at_once(1) - KERNEL_BYTES
    run = write_run(tmp_path / "n4", 4, BASE + 4 * (lower + upper) // 2)
    [top, *_] = sorted(json.loads((run / "summary.json").read_text())["ranks"], key=lambda r: r["rank"])
    # THEN the collectives set it, and the cause names both figures of the live model, by hand
    assert top["peak_phase"] == "collectives"
    text = " ".join(peak_cause(top).split())
    assert f"{format_bytes(one_at_a_time(4))} of collective outputs in all" in text
    assert f"{format_bytes(all_at_once(4))} if every gathered tensor's outputs and quotient were alive at once" in text
    # AND one table alone names one figure
    for path in run.glob("rank-*.jsonl"):
        path.write_text("\n".join(line for line in path.read_text().splitlines() if "model/b/" not in line) + "\n")
    [alone, *_] = sorted(summarize(load_run(str(run)))["ranks"], key=lambda r: r["rank"])
    assert "were alive at once" not in peak_cause(alone)
