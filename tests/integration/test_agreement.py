"""Agreement between ranks under real mpirun (memdiag.agreement): the MPI and Horovod transports with ranks
that ask in different orders, or one rank that asks once more; and a user's script whose ranks reduce
the same sparse gradients in different orders, which Horovod runs as written and memdiag's auto ends at
once with the reason (before: Horovod paired the ranks' eager max-allreduces in call order, so each
tensor's rows were agreed with another tensor's, silently); and a rank with a sparse gradient the
others lack, which ends at the deadline with the reason (before: a hang until --timeout, whose
headline named a collective the ranks were waiting in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, memdiag, read_json, undeclared_record_fields

pytestmark = pytest.mark.mpi

DEADLINE_S = 1.5


def _mpirun(*args: str) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none",
           *(["--allow-run-as-root"] if os.geteuid() == 0 else []), sys.executable, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.mark.parametrize("transport", ["mpi", "horovod"])
def test_ranks_agree_in_order_and_a_wrong_order_or_a_missing_partner_is_a_clear_error(transport):
    # (mpirun's exit status is not the test's: the ranks leave without finalising MPI, see the script)
    done = _mpirun(str(ROOT / "tests" / "agreement_script.py"), transport, str(DEADLINE_S))
    seen = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                  key=lambda s: s["rank"])
    assert [s["rank"] for s in seen] == [0, 1], done.stdout + done.stderr
    # every rank gets every rank's figures, in rank order; a kept key is not exchanged again
    assert all(s["gather"] == [[0, 0], [1, 10]] and s["max"] == [1, 10] for s in seen)
    # opposite orders: both ranks learn it at the first exchange, each naming its own key, long before
    # the deadline (no waiting: the exchange itself shows the keys differ)
    assert "rank 0: agreement 1 is on 'rows/x' here but on another key on rank 1" in seen[0]["order_error"]
    assert "rank 1: agreement 1 is on 'rows/y' here but on another key on rank 0" in seen[1]["order_error"]
    assert all(s["order_s"] < DEADLINE_S for s in seen)
    # one key more on rank 1: rank 0 is done, rank 1 gives up at the deadline, naming the key
    assert seen[0]["extra_error"] is None
    assert f"the other ranks did not agree on 'rows/only-last' (agreement 2 of this rank) within {DEADLINE_S:g} s" \
        in seen[1]["extra_error"]
    assert seen[1]["extra_s"] >= DEADLINE_S


def test_a_script_whose_ranks_reduce_sparse_gradients_in_other_orders_ends_at_once_under_auto(runs_root):
    script = ROOT / "tests" / "order_script.py"
    # GIVEN a script that plain Horovod runs as written (its collectives are paired by name)
    plain = _mpirun(str(script), "--steps", "2")
    assert plain.returncode == 0 and "step 1 loss" in plain.stdout, plain.stdout + plain.stderr
    # WHEN memdiag's auto must agree, per tensor, while each rank traces its own order
    out = runs_root / "order-auto"
    done = memdiag("run", str(script), "-n", "2", "--mode", "auto", "--timeout", "300", "--out", str(out),
                   "--", "--steps", "2")
    # THEN both ranks end with the reason, naming the tensor each met first, well before the time limit
    assert done.returncode != 0
    failure = read_json(out / "summary.json")["failure"]
    assert failure["kind"] == "error", failure
    assert failure["headline"].startswith("rank 0 failed: AgreementError: rank 0: agreement 1 is on 'rows/first' "
                                          "here but on another key on rank 1")
    text = " ".join(done.stdout.split())
    assert "rank 1 failed before its first step: AgreementError: rank 1: agreement 1 is on 'rows/second'" in text
    assert "past --timeout" not in text and "hang" not in failure["headline"]
    assert undeclared_record_fields(out) == {}


def test_a_rank_with_a_sparse_gradient_the_others_lack_ends_the_job_at_the_deadline_with_the_reason(runs_root):
    # GIVEN a script whose last rank reduces one more table's gradient (plain Horovod waits for ever there)
    out = runs_root / "order-extra"
    done = memdiag("run", str(ROOT / "tests" / "order_script.py"), "-n", "2", "--mode", "auto", "--timeout", "30",
                   "--out", str(out), "--", "--steps", "2", "--same-order", "--extra")
    # THEN that rank gives up at the agreement's deadline (--timeout less 7.5 s), naming the tensor, and the
    # report's headline is its reason, not the other rank's collective that Horovod's shutdown ended
    assert done.returncode != 0
    failure = read_json(out / "summary.json")["failure"]
    assert failure["kind"] == "error", failure
    assert failure["headline"].startswith("rank 1 failed: AgreementError: rank 1: the other ranks did not agree on "
                                          "'traced/zzz_extra:0' (agreement 3 of this rank) within "), failure
    assert "past --timeout" not in " ".join(done.stdout.split())
