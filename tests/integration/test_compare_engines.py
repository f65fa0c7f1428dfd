"""`memdiag compare --engine both` on real ranks: Horovod and MultiWorkerMirroredStrategy side by side.

One comparison of the tiny Transformer at N=2, modes sparse and dense, on both engines (four runs and
Horovod's verification run). Expected figures are worked out here by hand from the preset's shapes
(memdiag/workloads/configs.py), never by memdiag's code:

transformer, tiny: vocab 512, d_model 32 (the embedding width), 1 layer, 2 heads, filter 64, seq_len
16, 256 tokens per rank: 16 sentences of 16 source ids per rank and step. The source table's gradient
is an IndexedSlices of 256 rows of 32 float32 (128 B), with int32 ids (4 B): 132 B a row gathered.
Every rank has 256 rows, so MWMS pads nothing and both engines gather 2 x 256 x 132 = 67,584 B per rank
and step (MWMS first gathers the row counts, 2 x 4 B). The tied target table's gradient is dense.
Parameters, float32: tables 2 x 512 x 32 = 32,768; per attention block 4 x 32 x 32 = 4,096; a layer
norm 64; a feed-forward block 32 x 64 + 64 + 64 x 32 + 32 = 4,192. Encoder 4,096 + 64 + 4,192 + 64 =
8,416; decoder 2 x 4,096 + 2 x 64 + 4,192 + 64 = 12,576; 53,760 floats = 215,040 B in all, 149,504 B
without the source table. Sparse all-reduces 149,504 B per step, dense 215,040 B and gathers nothing.
"""

from __future__ import annotations

import pytest

from memdiag.workloads.configs import PRESETS
from tests.helpers import memdiag, read_json

pytestmark = [pytest.mark.mpi, pytest.mark.tfdist, pytest.mark.horovod, pytest.mark.timeout(900)]

HVD, TFD = "horovod", "tf-distribute"
N = 2
ROWS = 16 * 16  # source ids per rank and step
ROW = 32 * 4 + 4  # a gathered row: 32 float32 and its int32 id
GATHERED = N * ROWS * ROW  # 67,584
COUNTS = N * 4  # MWMS's gather of every worker's row count
ALL_GRADIENTS = 53_760 * 4  # 215,040
BUT_SOURCE = 37_376 * 4  # 149,504


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_preset_is_the_shape_the_figures_were_worked_out_for():
    tiny = PRESETS["transformer"]["tiny"]
    assert (tiny.vocab_size, tiny.d_model, tiny.embedding_width, tiny.num_layers, tiny.num_heads, tiny.filter_size,
            tiny.seq_len, tiny.tokens_per_rank, tiny.tie_target_embedding) == (512, 32, 32, 1, 2, 64, 16, 256, True)


@pytest.fixture(scope="module")
def both(runs_root):
    out = runs_root / "compare-both"
    result = memdiag("compare", "sparse-vs-dense", "transformer", "--preset", "tiny", "-n", str(N),
                     "--engine", "both", "--modes", "sparse,dense", "--steps", "2", "--max-warmup", "0",
                     "--timeout", "300", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result, read_json(out / "compare.json")


def test_both_engines_run_every_mode_in_directories_that_name_the_engine(both):
    out, _, data = both
    assert data["engine"] == "both" and data["engine_order"] == [HVD, TFD]
    for name in ("n2-sparse", "n2-dense", "tfd-n2-sparse", "tfd-n2-dense", "verify-n2", "tfd-verify-n2"):
        assert (out / name / "summary.json").is_file(), name
    assert read_json(out / "tfd-n2-sparse" / "run.json")["engine"] == TFD
    assert read_json(out / "n2-sparse" / "run.json")["engine"] == HVD
    keys = {(r["world_size"], r["engine"], r["mode"]): r for r in data["side_by_side"]}
    assert set(keys) == {(N, e, m) for e in (HVD, TFD) for m in ("sparse", "dense")}
    assert all(r["status"] == "ok" and r["steady_peak_rss_bytes_median"] > 0 for r in keys.values())


def test_the_bytes_side_by_side_are_the_figures_worked_out_by_hand(both):
    _, _, data = both
    rows = {(r["engine"], r["mode"]): r for r in data["side_by_side"]}
    for engine in (HVD, TFD):
        sparse, dense = rows[(engine, "sparse")], rows[(engine, "dense")]
        assert sparse["gathered_bytes_per_rank"] == sparse["predicted_gathered_bytes_per_rank"] == GATHERED
        assert sparse["allreduce_bytes_per_rank"] == BUT_SOURCE
        assert dense["gathered_bytes_per_rank"] == 0 and dense["allreduce_bytes_per_rank"] == ALL_GRADIENTS
    assert rows[(TFD, "sparse")]["lengths_bytes_per_rank"] == COUNTS
    assert rows[(HVD, "sparse")]["lengths_bytes_per_rank"] == 0
    # every worker has 256 rows: no padding, and the formula says none
    assert rows[(TFD, "sparse")]["padding_bytes_per_rank"] == rows[(TFD, "sparse")]["predicted_padding_bytes_per_rank"] == 0
    assert rows[(HVD, "sparse")]["padding_bytes_per_rank"] is None
    v = data["verdict"]
    assert v["world_size"] == N and v["gathered_bytes"] == {HVD: GATHERED, TFD: GATHERED}
    assert v["gathered_ratio"] == 1.0 and v["padding_bytes"] == 0 and v["equal_rows"] is True
    assert [rows for name, rows in v["rows_per_worker"].items() if "source_embedding" in name] == [[ROWS, ROWS]]
    assert v["formula_exact"] == {HVD: True, TFD: True}
    assert len(v["peaks"]) == 4 and v["lead_beyond_noise"] in (True, False)


def test_each_engine_is_checked_by_its_parameters_and_its_own_reduction_check(both):
    _, result, data = both
    c = data["correctness"]
    assert c["by_engine"] == {HVD: True, TFD: True}
    assert c["reduction_checked"] == [HVD, TFD]
    assert data["engines"][HVD]["correctness"]["reduction"]["passed"] is True
    tfd = data["engines"][TFD]["correctness"]["reduction"]
    assert tfd["passed"] is True and tfd["reduce_ops"] == ["sum"] and tfd["rounding_bound_ratio"] <= 1
    # the same data and initial values on both engines: final parameters within the stated tolerance
    assert {(x["world_size"], x["mode"]) for x in c["across_engines"]} == {(N, "sparse"), (N, "dense")}
    assert c["across_engines_passed"] is True and c["passed"] is True
    text = flat(result.stdout)
    assert result.stdout.startswith(f"At N={N} the lowest per-rank peak is ")
    assert text.count(f"reduction check at N={N}: allgather and dense allreduce") == 2
    assert "no reduction check" not in text and "Horovod only" not in text
    assert "tf-distribute's padding was 0 B because every worker had the same rows (256 per tensor)" in text


def test_memdiag_report_rerenders_the_comparison_of_both_engines(both):
    out, result, data = both
    again = memdiag("report", str(out))
    assert again.returncode == 0 and flat(again.stdout) == flat(result.stdout.rsplit("comparison directory:", 1)[0])
    md = memdiag("report", str(out), "--format", "markdown")
    assert md.returncode == 0 and md.stdout.startswith("## compare sparse-vs-dense --engine both: transformer (tiny)")
    assert f"| {N} | tf-distribute | sparse |" in md.stdout
