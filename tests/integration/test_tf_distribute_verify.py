"""Real mpirun, real MultiWorkerMirroredStrategy, 2 workers: the reduction check of
`memdiag compare --engine tf-distribute` (the verification run ``tfd-verify-n2``, one step, mode sparse).

transformer, tiny (figures in tests/integration/test_tf_distribute_builtin.py): one IndexedSlices
gradient, the source table's, 256 rows per worker and step, so the strategy's gather carries 2 x 256 =
512 rows (no padding: equal rows) and the check sums at most 512 of them into one row. MWMS sums
(Keras reduces gradients with ReduceOp.SUM). Under ``--inject-fault sum-densified`` the densified
gradient is N x itself before the strategy sums it: the dense all-reduce is 2 x the gathered sum, a
relative difference of 1, far beyond rounding.
"""

from __future__ import annotations

import pytest

from tests.helpers import memdiag, read_json, read_records

pytestmark = [pytest.mark.mpi, pytest.mark.tfdist]

N = 2
GATHERED_ROWS = N * 256  # every worker's rows of the source table, gathered


def flat(text: str) -> str:
    return " ".join(text.split())


def compare(out, *extra: str):
    result = memdiag("compare", "sparse-vs-dense", "transformer", "--preset", "tiny", "-n", str(N),
                     "--engine", "tf-distribute", "--steps", "2", "--max-warmup", "0", "--timeout", "300",
                     "--out", str(out), *extra)
    return result, read_json(out / "compare.json")


def checks_of(out) -> list[dict]:
    return [r for rank in range(N) for r in read_records(out / "tfd-verify-n2" / f"rank-{rank}.jsonl")
            if r["type"] == "reduction_check"]


def test_the_gathered_and_the_dense_reduction_agree_within_rounding(runs_root):
    # Mode sparse alone: the check is the verification run's, and under Keras 3 a dense run's parameters
    # part from sparse's for the optimizer's sake (docs/howto/failed-check.md), which would fail the comparison.
    out = runs_root / "tfd-verify"
    result, data = compare(out, "--modes", "sparse")
    assert result.returncode == 0, result.stdout + result.stderr
    # the verification run is apart from the measured runs
    assert [r["mode"] for r in data["rows"]] == ["sparse"]
    assert not any("verify" in r["run_dir"] for r in data["rows"])
    checks = checks_of(out)
    # one record per worker for the one IndexedSlices gradient, the source table's
    assert len(checks) == N and {c["rank"] for c in checks} == set(range(N))
    for c in checks:
        assert "source_embedding" in c["name"] and c["engine"] == "tf-distribute"
        assert c["reduce_op"] == "sum" and c["against"] == "dense" and c["compression"] is None
        assert "nonzero_elsewhere" not in c
        assert 0 < c["rows_compared"] <= 512 and 1 <= c["terms_max"] <= GATHERED_ROWS
        assert c["rounding_bound_ratio"] <= 1
    reduction = data["correctness"]["reduction"]
    assert reduction["passed"] is True and reduction["world_size"] == N and reduction["reduce_ops"] == ["sum"]
    assert data["correctness"]["passed"] is True
    text = flat(result.stdout)
    assert f"reduction check at N={N}: allgather and dense allreduce of 1 gradient(s)" in text
    assert "no reduction check" not in text and "Horovod only" not in text


def test_a_densified_gradient_scaled_by_n_fails_the_reduction_check(runs_root):
    # GIVEN the densified gradient multiplied by N before the strategy sums it (sparse only: the measured
    # run never densifies, so the reduction check alone can fail)
    out = runs_root / "tfd-verify-fault"
    result, data = compare(out, "--modes", "sparse", "--inject-fault", "sum-densified")
    # THEN the comparison fails, by its reduction check
    assert result.returncode == 1, result.stdout + result.stderr
    checks = checks_of(out)
    assert len(checks) == N
    for c in checks:
        assert 0.99 < c["max_rel_diff"] < 1.01  # N x the sum against the sum, N = 2
        assert c["rounding_bound_ratio"] > 1e3
    c = data["correctness"]
    assert c["passed"] is False and c["reduction"]["passed"] is False and c["checks"] == []
    assert "Correctness FAILED" in result.stdout and f"reduction check at N={N}" in flat(result.stdout)
