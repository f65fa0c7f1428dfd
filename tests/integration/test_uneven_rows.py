"""Real mpirun, real Horovod, 2 ranks: a script whose ranks look up different numbers of ids
(tests/uneven_rows_script.py), measured as written, then predicted at 4 ranks.

Worked out by hand: rank r looks up 2000 + 3000 r ids per step of a 4000 x 128 float32 table with int64
ids, 128 x 4 + 8 = 520 B a gathered row. Horovod's allgatherv gives both ranks 2000 + 5000 = 7000 rows:
7000 x 520 = 3,640,000 B per step. Predicted at N=4 from the largest rank's 5000 rows: 4 x 5000 x 520 =
10,400,000 B gathered (not 4 x 2000 x 520 = 4,160,000, rank 0's), beside the head's 128 x 4 = 512 B allreduce.
"""

from __future__ import annotations

import json

import pytest

from tests.helpers import ROOT, memdiag, read_json

pytestmark = pytest.mark.mpi

SCRIPT = ROOT / "tests" / "uneven_rows_script.py"


@pytest.mark.parametrize("unknown", [False, True], ids=["rows traced", "rows unknown when traced"])
def test_the_formula_uses_every_ranks_rows_and_predict_the_largest_ranks(runs_root, unknown):
    out = runs_root / f"uneven-{'unknown' if unknown else 'traced'}"
    done = memdiag("run", str(SCRIPT), "-n", "2", "--out", str(out), "--", "--steps", "3",
                   *(["--unknown-rows"] if unknown else []))
    assert done.returncode == 0, done.stdout + done.stderr
    summary = read_json(out / "summary.json")
    [policy] = summary["policy"]
    assert policy["own_rows_by_rank"] == {"0": 2000, "1": 5000} and policy["rows_gathered"] == 7000
    assert policy["rows_from"] == ("records" if unknown else "trace")
    assert policy["formula_gathered_bytes"] == 3_640_000
    assert [r["allgather_bytes_per_step"] for r in summary["ranks"]] == [3_640_000, 3_640_000]
    assert "rows differ between ranks (rank 0: 2000, rank 1: 5000)" in " ".join(done.stdout.split())
    predicted = memdiag("predict", str(out), "--ranks", "4", "--modes", "sparse", "--format", "json")
    assert predicted.returncode == 0, predicted.stdout + predicted.stderr
    table = json.loads(predicted.stdout)
    assert table["not_predicted"] == {}
    [row] = table["rows"]
    assert row["gathered_bytes_per_rank"] == 10_400_000
    assert row["collective_bytes_per_rank"] == 10_400_000 + 512
