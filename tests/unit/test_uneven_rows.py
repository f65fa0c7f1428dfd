"""Ranks with different rows: the formula uses the rows gathered (the sum over the ranks), predict the
largest rank's; rows unknown when the graph was traced come from the records; no table is dropped.

The runs are written by memdiag's own record writer and tracer, as a rank writes them: rank r looks up
2000 + 3000 r ids per step of a 4000 x 128 float32 table with int64 ids, so a gathered row is
128 x 4 + 8 = 520 B. At N=2 rank 0 has 2000 rows, rank 1 5000; Horovod's allgatherv gives every rank
7000 rows: 7000 x 520 = 3,640,000 B per step (values 7000 x 512 = 3,584,000, indices 7000 x 8 = 56,000).
Every expected figure below is worked out by hand from these sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memdiag._errors import UserError
from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.analyze import compare
from memdiag.analyze.correctness import most_terms
from memdiag.analyze.model import build_model, prediction_table
from memdiag.analyze.predicted import predicted_gathered
from memdiag.analyze.projection import base_from_summary
from memdiag.analyze.summary import summarize
from memdiag.format import rundir
from memdiag.format.reader import load_run
from memdiag.format.writer import RecordWriter
from memdiag.formula import SparseGradientShape
from memdiag.policy import decide
from memdiag.report.predict import notes
from tests.unit.fake_run import meta

TABLE = "model/table/embeddings:0"
WIDTH, VOCAB = 128, 4000


def own_rows(rank: int) -> int:
    return 2000 + 3000 * rank


def uneven_run(path: Path, world_size: int = 2, mode: str = "sparse", traced: bool = True, steps: int = 3,
               peak: int = 500_000_000, counts_on_step: int | None = None) -> Path:
    """A run of a script whose rank r looks up own_rows(r) ids per step, as the agent records it: a policy
    record per rank (its own rows, or none where the graph did not know the batch size), then per step
    the gradient's collectives and a dense kernel's allreduce."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"script": "uneven.py", "mode": mode, "world_size": world_size,
                                               "steps": steps, "status": "ok"}))
    total = sum(own_rows(r) for r in range(world_size))
    for rank in range(world_size):
        rows = own_rows(rank)
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        tracer = Tracer(writer, MemorySampler(), rank, auto_steps=False)
        writer.write_now({"type": "start", "size": world_size, "host": "h", "versions": {"tensorflow": "2.15.1"}})
        if world_size > 1:  # one rank reduces nothing: no policy
            shape = SparseGradientShape(rows, WIDTH * 4, 8, VOCAB, WIDTH) if traced else None
            decision = decide(mode, TABLE, world_size, shape, local_rows=rows if traced else None)
            writer.add({**decision.as_record(), "step": -1})
        for step in range(steps):
            tracer.begin_step(step)
            if counts_on_step is not None:  # every step's count of T, recorded under one step (Keras fit's)
                writer.add({"type": "distinct_rows", "step": counts_on_step, "name": TABLE, "rows": rows,
                            "distinct_rows": rows, "merge_s": None})
            if world_size > 1 and mode == "sparse":
                tracer.collective(meta("allgather", TABLE, "values", sparse=True), [rows, WIDTH], [total, WIDTH])
                tracer.collective(meta("allgather", TABLE, "indices", sparse=True, itemsize=8, dtype="int64"),
                                  [rows], [total])
            elif world_size > 1:
                tracer.collective(meta("allreduce", TABLE, sparse=True, densified=True), [VOCAB, WIDTH], [VOCAB, WIDTH])
            if world_size > 1:
                tracer.collective(meta("allreduce", "model/kernel:0"), [WIDTH, WIDTH], [WIDTH, WIDTH])
            tracer.end_step(step, loss=5.0 - step, items=rows, param_digest=f"d{step}")
        writer.write_now({"type": "end", "status": "ok", "error": None, "hwm_bytes": 1})
        writer.close()
    summary = summarize(load_run(str(path)))
    # steady peaks as a measured run would have them (the fake sampler measures this test process)
    summary["steady_peak_rss_bytes_max"] = summary["peak_rss_bytes_max"] = peak
    rundir.write_json(str(path / rundir.SUMMARY), summary)
    return path


def policy_of(summary: dict) -> dict:
    [policy] = summary["policy"]
    return policy


def test_the_summary_keeps_every_ranks_rows_and_the_formula_equals_the_gathered_bytes_to_the_byte(tmp_path):
    summary = compare.load_summary(str(uneven_run(tmp_path / "n2")))
    policy = policy_of(summary)
    assert policy["own_rows_by_rank"] == {"0": 2000, "1": 5000}
    assert policy["rows_gathered"] == 7000 and policy["rows_largest_rank"] == 5000
    assert policy["rows_from"] == "trace"  # every rank's graph knew its rows
    assert policy["formula_gathered_bytes"] == 3_640_000
    # the record's own figure stays as rank 0 wrote it (its 2000 rows); sparse agreed on nothing
    assert policy["local_rows"] == 2000 and policy["agreed_rows"] is None
    for rank in summary["ranks"]:
        assert rank["allgather_bytes_per_step"] == 3_640_000 == policy["formula_gathered_bytes"]


def test_counts_of_rows_recorded_under_the_wrong_step_do_not_override_the_rows_gathered(tmp_path):
    # GIVEN each step's count of T recorded under step 1 (three counts on one step), beside the allgathers
    policy = policy_of(compare.load_summary(str(uneven_run(tmp_path / "n2", counts_on_step=1))))
    # THEN the rows are each rank's own rows as its allgathers moved them: 2000 and 5000, not 3 x that
    assert policy["own_rows_by_rank"] == {"0": 2000, "1": 5000}
    assert policy["formula_gathered_bytes"] == 3_640_000


def test_rows_known_only_at_trace_time_are_summed_too(tmp_path):
    # GIVEN a dense run: nothing gathered, so the rows are those each rank's graph knew when traced
    policy = policy_of(compare.load_summary(str(uneven_run(tmp_path / "dense", mode="dense"))))
    assert policy["rows_from"] == "trace" and policy["own_rows_by_rank"] == {"0": 2000, "1": 5000}
    assert policy["rows_gathered"] == 7000 and policy["formula_gathered_bytes"] == 3_640_000


def test_the_formula_row_is_the_sum_of_both_ranks_rows_times_row_and_index_bytes(tmp_path):
    # GIVEN memdiag compare SCRIPT -n 1,2 (sparse): one rank gathers nothing, two ranks 7000 rows
    dirs = {(1, "sparse"): str(uneven_run(tmp_path / "n1-sparse", world_size=1)),
            (2, "sparse"): str(uneven_run(tmp_path / "n2-sparse"))}
    result = compare.build("uneven.py", None, dirs)
    # THEN the formula's growth per added rank is the 7000 rows x 520 B gathered at N=2 over its 2 ranks
    # (one rank gathers nothing: N=1 is not on the line), not rank 0's 2000 x 520 = 1,040,000
    assert result["growth_fitted_from_world_size"] == 1
    assert result["predicted_growth_bytes_per_rank"] == 7000 * 520 // 2 == 1_820_000
    # AND the tensor's line, from the records, says the same
    [tensor] = result["tensors"]
    assert tensor["growth_bytes_per_rank"] == 1_820_000 and tensor["gathered_bytes"] == 3_640_000
    # AND the correctness allowance counts the 7000 rows one element can sum
    assert most_terms(compare.load_summary(dirs[(2, "sparse")]), 2) == 7000


def test_with_even_rows_over_two_and_four_ranks_the_formula_row_is_one_ranks_rows(tmp_path):
    # GIVEN the same table with 2000 rows on every rank, at N=2 and N=4 (the older summaries' figure)
    def even(path: Path, n: int) -> str:
        out = uneven_run(path, world_size=n)
        summary = compare.load_summary(str(out))
        policy = policy_of(summary)
        policy.update(own_rows_by_rank={str(r): 2000 for r in range(n)}, rows_gathered=n * 2000)
        rundir.write_json(str(out / rundir.SUMMARY), summary)
        return str(out)

    result = compare.build("even.py", None, {(2, "sparse"): even(tmp_path / "a", 2), (4, "sparse"): even(tmp_path / "b", 4)})
    assert result["predicted_growth_bytes_per_rank"] == 2000 * 520 == 1_040_000


def test_predict_extrapolates_from_the_largest_ranks_rows_and_says_so(tmp_path):
    summary = compare.load_summary(str(uneven_run(tmp_path / "n2")))
    model = build_model([summary])
    # N=4: every rank counted as the largest, 4 x 5000 x 520; not 4 x 2000 x 520 = 4,160,000
    assert model.gathered_bytes("sparse", 4) == 10_400_000
    # the kernel's allreduce (128 x 128 x 4 = 65,536 B) beside it
    assert model.collective_bytes("sparse", 4) == 10_400_000 + 65_536
    table = prediction_table(model, [4], ["sparse"])
    assert table["rows"][0]["gathered_bytes_per_rank"] == 10_400_000
    assert table["not_predicted"] == {}
    text = notes(table).plain
    assert "extrapolated from the largest rank's rows, 5000 per rank" in text
    assert "the ranks had 2000-5000, 7000 gathered at N=2" in text
    assert "read from the run's records" not in text  # the graph knew them


def test_rows_read_off_the_records_are_said_so(tmp_path):
    sparse = compare.load_summary(str(uneven_run(tmp_path / "s", traced=False)))
    dense = compare.load_summary(str(uneven_run(tmp_path / "d", mode="dense", traced=False)))
    text = notes(prediction_table(build_model([sparse, dense]), [4], ["sparse"])).plain
    assert "rows unknown when the graph was traced, read from the run's records" in text


def test_a_table_whose_rows_were_unknown_when_traced_is_predicted_from_the_records(tmp_path):
    # GIVEN a sparse run whose graph knew no shape (policy records with nothing but the decision) and a
    # dense run of the same script, whose densified allreduce shows the table's 4000 rows
    sparse = compare.load_summary(str(uneven_run(tmp_path / "s", traced=False)))
    dense = compare.load_summary(str(uneven_run(tmp_path / "d", mode="dense", traced=False)))
    policy = policy_of(sparse)
    assert policy.get("local_rows") is None and policy.get("agreed_rows") is None
    assert policy["rows_from"] == "records" and policy["shape_from"] == "records"
    assert (policy["row_bytes"], policy["index_bytes"], policy["row_elements"]) == (512, 8, 128)
    assert policy_of(dense)["dense_rows"] == 4000
    # WHEN predicted from both THEN the table is there, with the rows the sparse run recorded
    model = build_model([sparse, dense])
    assert model.not_predicted == {}
    assert model.tensors[TABLE] == SparseGradientShape(5000, 512, 8, 4000, 128)
    assert model.collective_bytes("dense", 8) == 4000 * 512 + 65_536


def test_a_table_that_cannot_be_predicted_is_named_with_why_by_predict_and_by_the_projection(tmp_path):
    # GIVEN the sparse run alone: the records show the rows, nothing shows the table's size
    sparse = compare.load_summary(str(uneven_run(tmp_path / "s", traced=False)))
    model = build_model([sparse])
    [(name, why)] = model.not_predicted.items()
    assert name == TABLE and "table's row count was not recorded" in why and "a dense run records it" in why
    table = prediction_table(model, [4], ["sparse"])
    assert table["not_predicted"] == {TABLE: why}
    assert f"NOT PREDICTED, left out of every figure above: {why}" in notes(table).plain
    assert "no IndexedSlices gradient is gathered" not in notes(table).plain
    # AND the projection refuses the same run for the same reason
    with pytest.raises(UserError, match="table's row count was not recorded"):
        base_from_summary(sparse, "s", items_per_rank=2000, compute_s=0.1)


def test_the_table_rows_of_an_untraced_gradient_come_from_the_saved_parameters(tmp_path):
    # GIVEN the sparse run alone, with rank 0's initial parameters saved as a run saves them ("INDEX:NAME")
    path = tmp_path / "s"
    uneven_run(path, traced=False)
    np.savez(path / "params_initial.npz", **{f"0000:{TABLE}": np.zeros((VOCAB, WIDTH), np.float32),
                                             "0001:model/kernel:0": np.zeros((WIDTH, WIDTH), np.float32)})
    sparse = summarize(load_run(str(path)))
    assert policy_of(sparse)["dense_rows"] == 4000 and policy_of(sparse)["shape_from"] == "records"
    sparse["steady_peak_rss_bytes_max"] = sparse["peak_rss_bytes_max"] = 500_000_000
    model = build_model([sparse])
    assert model.not_predicted == {} and model.gathered_bytes("sparse", 4) == 10_400_000


def test_a_dense_run_alone_of_an_untraced_table_names_the_unknown_rows(tmp_path):
    dense = compare.load_summary(str(uneven_run(tmp_path / "d", mode="dense", traced=False)))
    why = build_model([dense]).not_predicted[TABLE]
    assert why.startswith("its rows per rank were unknown when the graph was traced and no run recorded them")


def test_a_summary_written_before_the_rows_fields_is_still_read(tmp_path):
    summary = compare.load_summary(str(uneven_run(tmp_path / "n2")))
    policy = policy_of(summary)
    for key in ("own_rows_by_rank", "rows_gathered", "rows_largest_rank", "rows_from", "formula_gathered_bytes"):
        del policy[key]
    # THEN the rows of its policy record (2000, rank 0's own) are taken for every rank, as before
    assert build_model([summary]).gathered_bytes("sparse", 4) == 4 * 2000 * 520
    assert predicted_gathered(summary, 2) == 2 * 2000 * 520
    assert most_terms(summary, 2) == 4000


def test_the_formula_of_a_run_with_a_gathered_tensor_of_unknown_size_is_unknown_not_partial(tmp_path):
    summary = compare.load_summary(str(uneven_run(tmp_path / "n2")))
    other = {**policy_of(summary), "name": "model/side:0", "row_bytes": None}
    assert predicted_gathered(summary, 2) == 3_640_000
    summary["policy"].append(other)
    assert predicted_gathered(summary, 2) is None
