"""Real mpirun, real Horovod: `memdiag scale resnet50 --ranks 1,2 --weak` on the tiny preset."""

from __future__ import annotations

import os

import pytest

from memdiag.format.reader import read_rank_file
from memdiag.workloads.configs import PRESETS
from tests.helpers import memdiag, read_json

pytestmark = [pytest.mark.mpi, pytest.mark.slow]  # ResNet-50 graphs: the extended tier
TINY = PRESETS["resnet50"]["tiny"]


@pytest.fixture(scope="module")
def study(runs_root):
    out = runs_root / "scale-resnet50"
    result = memdiag("scale", "resnet50", "--ranks", "1,2", "--weak", "--steps", "2", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


def _trainable_parameter_bytes() -> int:
    import tensorflow as tf

    from memdiag.workloads.resnet import build_model

    return sum(int(tf.size(v)) * v.dtype.size for v in build_model(TINY).trainable_variables)


def test_scale_writes_one_run_per_rank_count_and_a_table(study):
    out, result = study
    scale = read_json(out / "scale.json")
    rows = scale["rows"]
    assert [r["world_size"] for r in rows] == [1, 2]
    assert all(r["status"] == "ok" and r["throughput"] > 0 for r in rows)
    assert all(r["items_per_rank"] == TINY.batch_per_rank for r in rows)  # weak: same images per rank
    assert rows[0]["speedup"] == pytest.approx(1.0) and rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["efficiency"] == pytest.approx(rows[1]["throughput"] / 2 / rows[0]["throughput"])
    for n in (1, 2):
        assert (out / f"n{n}" / "summary.json").exists() and (out / f"n{n}" / "horovod-timeline.json").exists()
    table = [line for line in result.stdout.splitlines() if line.startswith(("│ 1 │", "│ 2 │"))]
    assert len(table) == 2, result.stdout


def test_resnet50_gradients_are_all_dense_allreduces(study):
    out, _ = study
    one, two = read_json(out / "scale.json")["rows"]
    # THEN nothing is gathered at any rank count, and at N=2 every rank allreduces exactly the
    # model's trainable parameters once per step (Horovod runs no collective on one rank)
    assert one["allgather_bytes_per_rank"] == 0 and two["allgather_bytes_per_rank"] == 0
    assert one["collective_bytes_per_rank"] == 0
    assert two["allreduce_bytes_per_rank"] == _trainable_parameter_bytes()
    assert 0 < two["collective_time_fraction"] < 1 and two["collective_time_s"] > 0


def test_one_host_is_reported_as_not_a_scaling_experiment(study):
    out, result = study
    scale = read_json(out / "scale.json")
    # Both rank counts share the one host's cores (2 cores per rank at N=1, fewer at N=2)
    assert scale["scaling_experiment"] is False
    text = " ".join(result.stdout.split())
    assert "NOT a scaling experiment" in text
    if (os.cpu_count() or 1) < 2:
        assert "oversubscribed" in text


def test_projection_from_the_study_treats_sparse_and_dense_alike_for_resnet50(study):
    out, _ = study
    saved = (out / "scale.json").read_text()
    # WHEN the saved study is projected again (no new runs)
    result = memdiag("scale", "--from", str(out), "--project", "64,1200", "--alpha", "5e-6", "--beta", "10e9")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ResNet-50 large-minibatch SGD" in result.stdout
    # THEN with no IndexedSlices gradient both modes project the same efficiencies
    lines = [line for line in result.stdout.splitlines() if line.startswith(("│   64 │", "│ 1200 │"))]
    assert len(lines) == 2, result.stdout
    for line in lines:
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells[1] == cells[2] and cells[3] == cells[4], line  # weak and strong: sparse == dense
    assert (out / "scale.json").read_text() == saved  # --from reads, never rewrites


def test_a_rank_killed_by_the_memory_limit_is_named_as_memdiag_run_names_it(runs_root):
    # GIVEN a limit of 200 MiB, below what a rank holds once TensorFlow is imported
    limit = 200 * 2**20
    out = runs_root / "scale-resnet50-killed"
    # WHEN a one-rank study runs under it
    result = memdiag("scale", "resnet50", "--ranks", "1", "--weak", "--steps", "1", "--mem-limit", str(limit),
                     "--out", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    # THEN rank 0 was killed by the limit, as its own record says
    killed = read_rank_file(str(out / "n1" / "rank-0.jsonl"), 0).killed
    assert killed is not None and killed["reason"] == "mem-limit"
    assert killed["limit_bytes"] == limit < killed["rss_bytes"]
    # and the study names the kill, the step and the limit in the words of `memdiag run`'s report
    failure = read_json(out / "n1" / "summary.json")["failure"]
    assert failure["kind"] == "mem-limit"
    assert failure["headline"].startswith(f"rank 0 killed at step {killed['step']} by the memory limit")
    assert "200 MiB" in failure["headline"]
    scale = read_json(out / "scale.json")
    assert any(failure["headline"] in warning for warning in scale["warnings"]), scale["warnings"]
    assert failure["headline"] in " ".join(result.stdout.split()), result.stdout
    # and the point's run.json says killed, not died
    assert read_json(out / "n1" / "run.json")["rank_status"] == {"0": "killed"}
