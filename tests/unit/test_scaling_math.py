"""The measured side of ``memdiag scale``: efficiency arithmetic, time in collectives from Horovod's
timeline, the verdict on the set-up, and the per-rank batch of strong scaling."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from memdiag._errors import UserError
from memdiag.analyze.projection import Network, scaling_efficiency, speedup
from memdiag.analyze.scaling import (
    ProjectionRequest,
    add_ratios,
    build_result,
    covered_seconds,
    execution_intervals,
    study_warnings,
    timeline_intervals,
)
from memdiag.launch.options import LaunchOptions
from memdiag.launch.studies import ScaleRequest
from memdiag.report.scale import print_scale


def test_weak_efficiency_is_the_per_rank_throughput_ratio():
    # 1 rank: 100 items/s; 4 ranks: 360 items/s -> 90 items/s per rank, 90% of one rank's 100
    assert scaling_efficiency(360, 4, 100, 1) == pytest.approx(0.90)
    assert speedup(360, 100) == pytest.approx(3.6)


def test_strong_efficiency_is_speedup_over_the_rank_ratio():
    # 2 ranks: 180 items/s; 8 ranks: 540 items/s -> speedup 3 on 4 times the ranks: 75%
    assert scaling_efficiency(540, 8, 180, 2) == pytest.approx(0.75)
    assert scaling_efficiency(180, 2, 180, 2) == pytest.approx(1.0)


def _row(n, throughput, status="ok"):
    return {"world_size": n, "throughput": throughput, "status": status, "speedup": None, "efficiency": None}


def test_ratios_are_taken_against_the_smallest_rank_count_that_ran():
    rows = [_row(1, None, "failed"), _row(2, 200.0), _row(4, 300.0)]
    add_ratios(rows)
    assert rows[0]["speedup"] is None and rows[0]["efficiency"] is None
    assert rows[1]["speedup"] == pytest.approx(1.0) and rows[1]["efficiency"] == pytest.approx(1.0)
    assert rows[2]["speedup"] == pytest.approx(1.5) and rows[2]["efficiency"] == pytest.approx(0.75)


def test_overlapping_collectives_count_once_and_are_clipped_to_the_step():
    intervals = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (7.0, 8.0)]
    # [0.5, 5.5]: 0.5..3.0 (the first two merged) and 5.0..5.5
    assert covered_seconds(intervals, 0.5, 5.5) == pytest.approx(3.0)
    assert covered_seconds(intervals, 3.0, 5.0) == 0.0


def _timeline(origin_us, activities):
    """Horovod timeline events: per tensor a NEGOTIATE_* activity, then the op with nested parts."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": origin_us}}]
    for pid, (negotiate, start, end) in enumerate(activities, start=1):
        events += [
            {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": negotiate, "pid": pid},
            {"ph": "X", "name": "0", "ts": negotiate, "pid": pid, "dur": 0},
            {"ph": "E", "ts": start, "pid": pid},
            {"ph": "B", "name": "ALLREDUCE", "ts": start, "pid": pid},
            {"ph": "B", "name": "MPI_ALLREDUCE", "ts": start + 1, "pid": pid},
            {"ph": "E", "ts": end - 1, "pid": pid},
            {"ph": "E", "ts": end, "pid": pid, "args": {"dtype": "float32", "shape": "[4]"}},
        ]
    return events


def test_execution_intervals_leave_negotiation_out_and_use_wall_clock_seconds():
    events = _timeline(1_000_000_000, [(0, 200_000, 500_000), (100_000, 400_000, 600_000)])
    assert execution_intervals(events) == [(1000.2, 1000.5), (1000.4, 1000.6)]


def test_a_truncated_timeline_keeps_its_complete_events(tmp_path):
    text = json.dumps(_timeline(1_000_000_000, [(0, 200_000, 500_000)]))
    path = tmp_path / "horovod-timeline.json"
    path.write_text(text[:-1] + ',{"ph": "B", "na')  # killed mid-event, array never closed
    assert timeline_intervals(str(path)) == [(1000.2, 1000.5)]
    assert timeline_intervals(str(tmp_path / "missing.json")) is None


def _scaling_row(n, cores_per_rank, per_host, cores=2, oversubscribed=False):
    return {"world_size": n, "cores_per_rank": cores_per_rank, "ranks_per_host": per_host, "cores_per_host": cores,
            "oversubscribed": oversubscribed}


def test_one_host_whose_cores_are_shared_is_not_a_scaling_experiment():
    ok, warnings = study_warnings([_scaling_row(1, 2, 1), _scaling_row(2, 1, 2), _scaling_row(4, 1, 4, oversubscribed=True)])
    assert not ok and len(warnings) == 1
    assert warnings[0].startswith("NOT a scaling experiment")
    assert "N=4 put 4 ranks on a host with 2 cores (oversubscribed)" in warnings[0]
    assert "cores per rank went 2 at N=1, 1 at N=2, 1 at N=4" in warnings[0]


def test_same_cores_per_rank_at_every_rank_count_is_a_scaling_experiment():
    ok, warnings = study_warnings([_scaling_row(4, 12, 4, cores=48), _scaling_row(16, 12, 4, cores=48)])
    assert ok and warnings == []


def test_strong_scaling_divides_the_presets_batch_by_the_rank_count():
    resnet = ScaleRequest("resnet50", [1, 2], "strong")  # tiny: 4 images per rank
    assert resnet.batch_overrides(2) == {"batch_per_rank": "2"}
    with pytest.raises(UserError, match="leaves nothing"):
        resnet.batch_overrides(8)
    # tiny Transformer: 256 tokens in sequences of 16; 256 // 3 = 85 -> 80, whole sequences
    transformer = ScaleRequest("transformer", [1, 3], "strong", options=LaunchOptions(overrides={"d_model": "16"}))
    assert transformer.batch_overrides(3) == {"d_model": "16", "tokens_per_rank": "80"}
    assert ScaleRequest("transformer", [1, 2], "weak").batch_overrides(2) == {}
    with pytest.raises(UserError, match="no preset 'huge'"):
        ScaleRequest("resnet50", [1, 2], "strong", options=LaunchOptions(preset="huge")).batch_overrides(2)
    with pytest.raises(UserError, match="--strong needs a built-in workload"):
        ScaleRequest("examples/user_tape_eager.py", [1, 2], "strong").batch_overrides(2)


# -- a whole study read back from run directories (no MPI) -------------------------------------------

def _write_run(path: Path, n: int, throughput: float, steps: list[tuple[float, float]],
               intervals: list[tuple[int, int]] | None, sparse: bool = True) -> None:
    """A run directory as memdiag writes it: manifest, summary, rank 0's steps, Horovod's timeline."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"world_size": n, "hosts": None, "cores_per_host": 2,
                                               "oversubscribed": n > 2, "status": "ok"}))
    collectives = [{"name": "m/kernel:0", "op": "allreduce", "part": None, "sparse": False, "densified": False,
                    "bytes_in_per_rank": 1_000_000, "rows_in": 250, "calls_per_step": 1.0, "dtype": "float32"}]
    policy = []
    if sparse:
        collectives.append({"name": "m/emb:0", "op": "allgather", "part": "values", "sparse": True,
                            "densified": False, "bytes_in_per_rank": 40_000, "rows_in": 100,
                            "calls_per_step": 1.0, "dtype": "float32"})
        policy.append({"name": "m/emb:0", "decision": "sparse", "local_rows": 100, "row_bytes": 400,
                       "index_bytes": 4, "dense_rows": 5000, "row_elements": 100})
    gather = 40_400 * n if sparse and n > 1 else 0
    reduce = 1_000_000 if n > 1 else 0
    summary = {
        "workload": "transformer", "preset": "tiny", "mode": "sparse", "world_size": n, "steps": len(steps) + 1,
        "status": "ok", "peak_rss_bytes_max": 500 * 2**20 + gather, "throughput_items_per_s": throughput,
        "ranks": [{"rank": r, "step_time_s": steps[0][1] - steps[0][0], "collective_bytes_per_step": gather + reduce,
                   "allgather_bytes_per_step": gather, "allreduce_bytes_per_step": reduce} for r in range(n)],
        "collectives": collectives if n > 1 else [], "policy": policy,
    }
    (path / "summary.json").write_text(json.dumps(summary))
    records = [{"type": "step", "step": 0, "t_start": 990.0, "t_end": 999.0, "step_time_s": 9.0, "items": 100}]
    records += [{"type": "step", "step": k + 1, "t_start": a, "t_end": b, "step_time_s": b - a, "items": 100}
                for k, (a, b) in enumerate(steps)]
    (path / "rank-0.jsonl").write_text("".join(json.dumps({**r, "rank": 0}) + "\n" for r in records))
    if intervals is not None:
        activities = [(start - 10_000, start, end) for start, end in intervals]
        (path / "horovod-timeline.json").write_text(json.dumps(_timeline(0, activities)))


STUDY = {"workload": "transformer", "preset": "tiny", "scaling": "weak", "mode": "sparse", "steps": 3,
         "rank_counts": [1, 2], "hosts": None, "overrides": {}, "batch_overrides": {}}


@pytest.fixture
def study_dirs(tmp_path):
    # N=1: no collectives at all. N=2: two 1-second steps; in the first the collectives cover
    # 0.2..0.5 and 0.4..0.6 (0.4 s once merged), in the second 1.1..1.3 (0.2 s): median 0.3 s, 30%.
    _write_run(tmp_path / "n1", 1, 1000.0, [(1000.0, 1000.5), (1000.5, 1001.0)], [])
    _write_run(tmp_path / "n2", 2, 1500.0, [(1000.0, 1001.0), (1001.0, 1002.0)],
               [(1000_200_000, 1000_500_000), (1000_400_000, 1000_600_000), (1001_100_000, 1001_300_000)])
    return {1: str(tmp_path / "n1"), 2: str(tmp_path / "n2")}


def test_a_study_reads_throughput_memory_bytes_and_time_in_collectives(study_dirs):
    result = build_result(STUDY, study_dirs, None)
    one, two = result["rows"]
    assert one["collective_time_s"] == 0.0 and one["collective_time_fraction"] == 0.0
    assert two["collective_time_s"] == pytest.approx(0.3) and two["collective_time_fraction"] == pytest.approx(0.3)
    assert two["speedup"] == pytest.approx(1.5) and two["efficiency"] == pytest.approx(0.75)
    assert two["allgather_bytes_per_rank"] == 80_800 and two["items_per_rank"] == 100
    assert not result["scaling_experiment"]
    assert result["projection"] is None


def test_a_study_projects_from_its_smallest_multi_rank_run(study_dirs):
    request = ProjectionRequest([2, 64], Network(1e-5, 1e9, "test"), fusion_bytes=64 * 2**20)
    projection = build_result(STUDY, study_dirs, request)["projection"]
    # N=2's step (1 s) minus its median time in collectives (0.3 s)
    assert projection["base"]["compute_s"] == pytest.approx(0.7)
    assert projection["base"]["world_size"] == 2 and projection["base"]["dense_allreduce_bytes"] == 1_000_000
    assert [r["world_size"] for r in projection["rows"]] == [2, 64]


def test_the_report_shows_rows_verdict_and_projection(study_dirs):
    request = ProjectionRequest([2, 1200], Network(1e-5, 1e9, "test"))
    result = build_result(STUDY, study_dirs, request)
    out = io.StringIO()
    print_scale(result, Console(width=160, file=out, force_terminal=True, color_system=None))
    text = out.getvalue()
    assert "transformer (tiny)  weak scaling" in text
    assert "NOT a scaling experiment" in text
    assert "300 ms 30%" in text and "0.75" not in text and "75%" in text
    assert "91% weak" in text  # the published figure beside the projected N=1200 row


def test_a_projection_that_cannot_be_made_keeps_the_measured_rows(tmp_path):
    # GIVEN a study whose only multi-rank run failed and whose one-rank run saved no parameters
    _write_run(tmp_path / "n1", 1, 1000.0, [(1000.0, 1000.5)], [])
    _write_run(tmp_path / "n2", 2, 1500.0, [(1000.0, 1001.0)], [])
    summary = json.loads((tmp_path / "n2" / "summary.json").read_text())
    (tmp_path / "n2" / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    request = ProjectionRequest([64], Network(1e-5, 1e9, "test"))
    result = build_result(STUDY, {1: str(tmp_path / "n1"), 2: str(tmp_path / "n2")}, request)
    # THEN the rows are there, the failure is named, and the projection says why it is missing
    assert [r["world_size"] for r in result["rows"]] == [1, 2]
    assert any("ended with status failed" in w for w in result["warnings"])
    assert result["projection"] is None and "--project needs a successful run" in result["projection_error"]
