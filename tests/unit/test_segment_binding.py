"""A growth segment between rank counts whose ranks could run on different CPU counts says so.

A plain mpirun binds each rank to one core while the ranks fit the host's cores and leaves them unbound
beyond, so on 2 cores N=2's ranks could run on one CPU and N=4's on two. TensorFlow sizes its thread pools
by them, and the growth between those rank counts spans that change as well as the collectives'. The runs
are test_live_bounds's two-table runs, repeated twice alike (run-to-run noise 0), with the start records
a rank writes given the CPUs it could run on.
"""

from __future__ import annotations

import json
from pathlib import Path

from memdiag.analyze import compare as compare_analysis
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
from tests.unit.test_live_bounds import BASE, RANK_COUNTS, STEPS, all_at_once, words, write_run

MiB = 2**20
CPUS = {2: 1, 4: 2, 8: 2}  # the CPUs a rank could run on at each rank count, as on 2 cores


def bound_run(path: Path, n: int, peak: int, cpus: int) -> str:
    run = write_run(path, n, peak)
    for rank in range(n):
        rank_file = run / f"rank-{rank}.jsonl"
        records = [json.loads(line) for line in rank_file.read_text().splitlines()]
        for record in records:
            if record.get("type") == "start":
                record.update(cpu_count=2, cpus_allowed=cpus)
        rank_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps(summarize(load_run(str(run))), default=str))
    return str(run)


def test_a_segment_across_a_change_of_binding_names_it(tmp_path):
    # GIVEN a growth above the live model's both figures at every segment, N=2 bound to one CPU a rank
    peaks = {n: BASE + all_at_once(n) + (n - 2) * 40 * MiB for n in RANK_COUNTS}
    run_dirs = {(n, "sparse"): [bound_run(tmp_path / f"n{n}-sparse", n, peaks[n], CPUS[n])] * 2 for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=2)
    result = json.loads(json.dumps(result, default=str))
    assert result["binding"] == {"2": [1], "4": [2], "8": [2]}
    first, second = result["physics"]["sparse_segments"]
    # THEN the segment from N=2 to 4 carries both CPU counts, the one from 4 to 8 none
    assert first["cpus_per_rank"] == [[1], [2]]
    assert "cpus_per_rank" not in second
    # AND its words name the change beside the unexplained gap; the other segment's do not
    text = words(result)
    across = text.split("N=2 to 4:")[1].split("; N=4 to 8")[0]
    assert "unexplained: " in across
    assert ("its ranks could run on 1 CPU(s) at N=2 and 2 at N=4 (the launcher's binding), and TensorFlow sizes "
            "its thread pools by them: the segment spans that change too") in across
    assert "its ranks could run on" not in text.split("N=4 to 8:")[1].split("Ranks bound by the launcher")[0]


def test_ranks_bound_alike_at_both_ends_add_nothing(tmp_path):
    peaks = {n: BASE + all_at_once(n) + (n - 2) * 40 * MiB for n in RANK_COUNTS}
    run_dirs = {(n, "sparse"): [bound_run(tmp_path / f"n{n}-sparse", n, peaks[n], 1)] * 2 for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=2)
    result = json.loads(json.dumps(result, default=str))
    assert all("cpus_per_rank" not in s for s in result["physics"]["sparse_segments"])
    segments = words(result).split("Sparse growth by segment")[1].split("Ranks bound by the launcher")[0]
    assert "N=2 to 4:" in segments and "its ranks could run on" not in segments
