"""--engine tf-distribute's policy: decided from every worker's rows (a stand-in for the MPI allgather),
MWMS's padded figures, and auto's choice. Expected figures worked out by hand: rows 1000 + 500 x worker
of a 5000 x 256 float32 table, int32 indices (1028 B a row gathered)."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from memdiag.agent.hooks_tf import StrategyHooks  # noqa: E402
from memdiag.agreement import Agreement  # noqa: E402

ROWS = {2: [1000, 1500], 4: [1000, 1500, 2000, 2500]}


class _Workers:
    """Stands in for the exchange between workers (memdiag.agreement's Transport): every worker's rows are
    known to the test; ``calls`` keeps this worker's."""

    def __init__(self, rows, calls):
        self.rank, self.size, self.rows, self.calls = 0, len(rows), rows, calls

    def exchange(self, seq, payload, timeout_s):
        self.calls.append(payload[1])
        return [(payload[0], r) for r in self.rows]


def _hooks(mode, world, rows, margin=1.0):
    decisions, calls = [], []
    hooks = StrategyHooks(None, mode, margin, lambda: world, decisions.append,
                          agreement=Agreement(_Workers(rows, calls)))
    return hooks, decisions, calls


def _gradient(rows):
    return tf.IndexedSlices(tf.zeros([rows, 256]), tf.zeros([rows], tf.int32), tf.constant([5000, 256]))


@pytest.mark.parametrize("mode", ["as-written", "sparse", "dense"])
def test_the_record_has_the_agreed_rows_and_mwms_padded_bytes_on_every_worker(mode):
    for local in ROWS[2]:
        hooks, decisions, calls = _hooks(mode, 2, ROWS[2])
        decision = hooks.decide("embeddings:0", _gradient(local))
        assert calls == [local] and decisions == [decision]
        record = decision.as_record()
        assert record["agreed_rows"] == 1500 and "rows_per_rank" not in record and record["local_rows"] == local
        assert record["rows_per_worker"] == [1000, 1500] and record["rows_total"] == 2500
        assert record["gathered_bytes"] == 2 * 1500 * 1028 == 3_084_000  # not 2 x 1000 x 1028 on worker 0
        assert record["padding_bytes"] == 500 * 1028 == 514_000
        assert record["dense_bytes"] == 5000 * 1024 == 5_120_000
        assert decision.densify == (mode == "dense")
        assert "MultiWorkerMirroredStrategy" in decision.reason and "Horovod" not in decision.reason


@pytest.mark.parametrize("world, densify, gathered, padding", [
    (2, False, 2 * 1500 * 1028, 500 * 1028),    # 3,084,000 <= 5,120,000: keep the gather
    (4, True, 4 * 2500 * 1028, 3000 * 1028),    # 10,280,000 > 5,120,000: densify
])
def test_auto_compares_the_padded_gather_with_the_dense_all_reduce(world, densify, gathered, padding):
    for local in ROWS[world]:
        hooks, decisions, calls = _hooks("auto", world, ROWS[world])
        decision = hooks.decide("embeddings:0", _gradient(local))
        assert decision.densify is densify and decision.reduction == ("dense" if densify else "sparse")
        assert decision.gathered_bytes == gathered and decision.padding_bytes == padding
        assert decision.reason.startswith("auto: padded gather") and ("dense all-reduce" in decision.reason)
        # kept for the whole job: no second agreement, no second record
        assert hooks.decide("embeddings:0", _gradient(local)) is decision and len(calls) == 1 and len(decisions) == 1


def test_a_margin_keeps_the_gather_until_it_exceeds_dense_by_that_factor():
    hooks, _, _ = _hooks("auto", 4, ROWS[4], margin=2.1)  # 10,280,000 <= 2.1 x 5,120,000 = 10,752,000
    decision = hooks.decide("embeddings:0", _gradient(1000))
    assert not decision.densify and "x 2.1" in decision.reason


def test_rows_unknown_when_traced_defer_auto_to_the_step_and_leave_other_modes_without_figures():
    seen = {}

    for mode in ("auto", "as-written"):
        hooks, decisions, calls = _hooks(mode, 2, [-1, -1])

        @tf.function(input_signature=[tf.TensorSpec([None, 256]), tf.TensorSpec([None], tf.int32)])
        def trace(values, indices, hooks=hooks, mode=mode):
            seen[mode] = hooks.decide("embeddings:0", tf.IndexedSlices(values, indices, tf.constant([5000, 256])))
            return values

        trace.get_concrete_function()
        assert calls == [-1]  # every worker takes part in the agreement, rows known or not
        seen[mode + ":records"] = decisions
    assert seen["auto"] is None and seen["auto:records"] == []
    decision = seen["as-written"]
    assert decision is not None and decision.shape is None and not decision.densify
    assert decision.as_record()["engine"] == "tf-distribute"
