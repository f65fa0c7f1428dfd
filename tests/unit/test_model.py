from __future__ import annotations

import pytest

from memdiag.analyze.model import build_model, prediction_table
from memdiag.formula import SparseGradientShape
from memdiag.report.predict import notes

ROWS, ROW_BYTES, INDEX, DENSE_ROWS, WIDTH = 1000, 400, 4, 500, 100


def summary(n: int, mode: str, peak: float, dense_rows: int = DENSE_ROWS) -> dict:
    shape = dict(local_rows=ROWS, row_bytes=ROW_BYTES, index_bytes=INDEX, dense_rows=dense_rows,
                 row_elements=WIDTH)
    gathered = n * ROWS * (ROW_BYTES + INDEX)
    return {
        "world_size": n, "mode": mode, "peak_rss_bytes_max": peak,
        "policy": [{"name": "emb", "decision": "dense" if mode == "dense" else "sparse", "world_size": n,
                    "gathered_bytes": gathered, "dense_bytes": dense_rows * ROW_BYTES, **shape}],
        "collectives": [{"op": "allreduce", "sparse": False, "bytes_out_per_rank": 1000, "calls_per_step": 1.0}],
        "ranks": [],
    }


def per_rank():
    return ROWS * (ROW_BYTES + INDEX)


def test_fit_recovers_the_cost_per_gathered_byte_and_predicts_larger_n():
    # GIVEN sparse peaks that grow by exactly 2 bytes per gathered byte above a 1e9 base
    base = 1e9
    runs = [summary(n, "sparse", base + 2 * n * per_rank()) for n in (2, 4)]
    runs += [summary(n, "dense", base + 5e6) for n in (2, 4)]
    model = build_model(runs)
    # the physical cost: values held twice (gathered and averaged), indices once
    assert model.cost_per_gathered_byte == pytest.approx((2 * ROW_BYTES + INDEX) / (ROW_BYTES + INDEX))
    assert model.fitted_cost == pytest.approx(2.0)
    # anchored at the largest measured N, and growing by the cost of each added rank's rows
    assert model.peak("sparse", 4) == pytest.approx(base + 2 * 4 * per_rank())
    expected_8 = base + 2 * 4 * per_rank() + model.cost_per_gathered_byte * 4 * per_rank()
    assert model.peak("sparse", 8) == pytest.approx(expected_8)
    assert model.peak("dense", 64) == pytest.approx(base + 5e6)


def test_collective_bytes_follow_the_formula_per_mode():
    # GIVEN a table of 5000 rows of 400 B (2,000,000 B dense) and 1000 rows of 404 B per rank gathered
    # (404,000 B per rank), beside 1000 B of dense allreduces: the crossover is N = 4.95
    model = build_model([summary(2, "sparse", 1e9, dense_rows=5000), summary(4, "sparse", 1.1e9, dense_rows=5000)])
    assert model.collective_bytes("sparse", 300) == 1000 + 300 * 404_000
    assert model.collective_bytes("dense", 300) == 1000 + 2_000_000
    # THEN auto gathers up to N=4 (1,616,000 <= 2,000,000) and densifies from N=5 (2,020,000 > 2,000,000)
    assert model.collective_bytes("auto", 1) == 0
    assert model.collective_bytes("auto", 2) == 1000 + 808_000
    assert model.collective_bytes("auto", 4) == 1000 + 1_616_000
    assert model.collective_bytes("auto", 5) == 1000 + 2_000_000
    assert model.collective_bytes("auto", 300) == 1000 + 2_000_000


def test_budget_and_32_bit_count_limit():
    model = build_model([summary(n, "sparse", 1e9 + 2 * n * per_rank()) for n in (2, 4)])
    table = prediction_table(model, [16, 1200], ["sparse", "dense"], budget=1e9 + 2 * 100 * per_rank())
    assert table["ranks_over_budget"]["sparse"] == 101
    assert table["ranks_over_budget"]["dense"] is None
    assert table["count_overflow"]["emb"] == (2**31 - 1) // (ROWS * WIDTH) + 1
    assert SparseGradientShape(5000, 4096, 4, 33945, 1024).overflow_ranks() == 420
    # merged first: U = 1000 distinct rows of 1024 floats per rank; 2**31 - 1 = 2097 x 1,024,000 + 1,035,647
    merged = SparseGradientShape(5000, 4096, 4, 33945, 1024, distinct_rows=1000)
    assert merged.merged_overflow_ranks() == 2098 and merged.overflow_ranks() == 420
    assert SparseGradientShape(5000, 4096, 4, 33945, 1024).merged_overflow_ranks() is None


# -- two regimes: max(compute peak, collective base + k x G(N)) -------------------------------------

def tensor(name: str, rows: int, dense_rows: int, reduce_op: str | None = None, row_bytes: int = ROW_BYTES,
           index_bytes: int = INDEX) -> dict:
    entry = {"name": name, "local_rows": rows, "row_bytes": row_bytes, "index_bytes": index_bytes,
             "dense_rows": dense_rows, "row_elements": row_bytes // 4}
    if reduce_op is not None:
        entry["reduce_op"] = reduce_op
    return entry


def two_regime_summary(n: int, mode: str, compute: float, collective: float, tensors: list[dict]) -> dict:
    """A summary.json dict with the fields that separate the compute and collective peaks."""
    return {
        "world_size": n, "mode": mode, "peak_rss_bytes_max": max(compute, collective),
        "compute_peak_rss_bytes_max": compute, "collective_peak_rss_bytes_max": collective,
        "steady_peak_rss_bytes_max": max(compute, collective),
        "policy": tensors, "collectives": [], "ranks": [],
    }


EMB = [tensor("emb", ROWS, DENSE_ROWS)]  # 1000 rows of 400 + 4 bytes per rank: G(N) = 404,000 N
# op=Average: k x G(N) = N x 1000 x (2 x 400 + 4) = 804,000 N


def test_one_rank_is_never_in_the_collective_regime_even_when_the_base_is_above_the_compute_peak():
    # GIVEN a collective window of 9,000,000 + 804,000 N (measured at N=4) over a compute peak of
    # 6,000,000, as without a pooling allocator, where the window also holds the end of the backward pass
    runs = [two_regime_summary(n, "sparse", 6_000_000, 9_000_000 + n * 804_000, EMB) for n in (2, 4)]
    model = build_model(runs)
    # THEN the collectives take over at N=2, the first N that runs any, not at N=1
    assert model.collective_peak("sparse", 1) > 6_000_000
    assert model.regime("sparse", 1) == "compute" and model.regime("sparse", 2) == "collectives"
    assert model.regime_change_ranks("sparse") == 2


def test_compute_sets_the_peak_at_small_n_and_the_gathered_buffers_from_the_named_rank_count():
    # GIVEN a compute peak of 10,000,000 at N >= 2 (one rank, with no Horovod buffers, measured more:
    # it must not count) and a collective window of 6,000,000 + 804,000 N measured at N=4
    runs = [
        two_regime_summary(1, "sparse", 50_000_000, 50_000_000, EMB),
        two_regime_summary(2, "sparse", 9_800_000, 7_608_000, EMB),
        two_regime_summary(4, "sparse", 10_000_000, 6_000_000 + 4 * 804_000, EMB),
    ]
    model = build_model(runs)
    # THEN the compute peak is the max over N >= 2, the base is anchored at N=4
    assert model.compute_peak == {"sparse": 10_000_000}
    assert model.base["sparse"] == pytest.approx(6_000_000)
    # and the collective window passes 10,000,000 when 804,000 N > 4,000,000: N > 4.975, so N=5
    assert model.regime_change_ranks("sparse") == 5
    assert model.peak("sparse", 4) == 10_000_000 and model.regime("sparse", 4) == "compute"
    assert model.peak("sparse", 5) == pytest.approx(10_020_000) and model.regime("sparse", 5) == "collectives"
    assert model.peak("sparse", 1) == 10_000_000
    # a budget of 11,000,000 is passed when 804,000 N > 5,000,000: N > 6.2, so N=7
    table = prediction_table(model, [4, 5, 8], ["sparse"], budget=11_000_000)
    assert table["ranks_over_budget"] == {"sparse": 7}
    assert table["regime_change_ranks"] == {"sparse": 5}
    assert table["compute_peak_bytes"] == {"sparse": 10_000_000}
    assert table["collective_base_bytes"]["sparse"] == pytest.approx(6_000_000)
    assert [r["regime"] for r in table["rows"]] == ["compute", "collectives", "collectives"]
    assert table["rows"][2]["peak_rss_bytes"] == pytest.approx(6_000_000 + 8 * 804_000)


def test_the_compute_peak_is_the_max_of_the_runs_not_their_median():
    runs = [two_regime_summary(n, "dense", compute, 1_000_000, EMB)
            for n, compute in ((2, 9_800_000), (4, 10_000_000), (8, 9_900_000))]
    assert build_model(runs).compute_peak["dense"] == 10_000_000  # the median would be 9,900,000


@pytest.mark.parametrize("reduce_op, k, growth_4_to_8", [
    (None, 804 / 404, 4 * 804_000),  # default: Average, values held twice, indices once
    ("average", 804 / 404, 4 * 804_000),
    ("sum", 1.0, 4 * 404_000),  # values and indices held once
])
def test_the_cost_of_a_gathered_byte_follows_the_reduce_op(reduce_op, k, growth_4_to_8):
    emb = [tensor("emb", ROWS, DENSE_ROWS, reduce_op)]
    model = build_model([two_regime_summary(4, "sparse", 1_000_000, 20_000_000, emb)])
    assert model.cost_per_gathered_byte == pytest.approx(k)
    assert model.peak("sparse", 8) - model.peak("sparse", 4) == pytest.approx(growth_4_to_8)
    assert prediction_table(model, [8], ["sparse"])["reduce_ops"] == {"emb": reduce_op or "average"}


def test_an_op_without_an_allgather_path_is_reduced_densely_in_every_mode():
    # Horovod 0.28.1 raises for an IndexedSlices with op=Adasum: the script must densify it
    emb = [tensor("emb", ROWS, DENSE_ROWS, "adasum")]
    model = build_model([two_regime_summary(4, "sparse", 1_000_000, 2_000_000, emb)])
    assert model.gathered_bytes("sparse", 8) == 0
    assert model.collective_bytes("sparse", 8) == DENSE_ROWS * ROW_BYTES  # 200,000
    assert model.peak("sparse", 1024) == 2_000_000


def test_mixed_reduce_ops_weight_k_by_the_gathered_bytes():
    # emb: Average, 404,000 B per rank, k 804/404; side: Sum, 10 rows x 404 = 4,040 B per rank, k 1
    mixed = [tensor("emb", ROWS, DENSE_ROWS), tensor("side", 10, 10**6, "sum")]
    model = build_model([two_regime_summary(4, "sparse", 1_000_000, 9_000_000, mixed)])
    # held: the larger gathered output (emb's) and emb's quotient; side's output is not alive beside emb's
    assert model.cost_per_gathered_byte == pytest.approx(804_000 / (404_000 + 4_040))
    assert model.held_bytes("sparse", 2) == pytest.approx(2 * 804_000)


def test_two_averaged_tensors_hold_one_gathered_output_and_one_quotient_at_a_time():
    # Horovod completes one allgather after another and each dividend is freed once its quotient is
    # made: the larger G plus the larger values, not the sum of both tensors' outputs.
    pair = [tensor("a", ROWS, DENSE_ROWS), tensor("b", ROWS // 2, DENSE_ROWS)]
    model = build_model([two_regime_summary(4, "sparse", 1_000_000, 9_000_000, pair)])
    # per N: a 404,000 (values 400,000), b 202,000 (values 200,000)
    assert model.held_bytes("sparse", 4) == pytest.approx(4 * 404_000 + 4 * 400_000)
    assert model.cost_per_gathered_byte == pytest.approx((404_000 + 400_000) / 606_000)


# auto, non-monotonic: "small" (1000 rows, dense 5000 rows = 2,000,000 B) is gathered up to N=4
# (5 x 404,000 > 2,000,000) and densified from N=5; "big" (10 rows of a 10^9-row table) is never
# densified up to 2^20. Per rank, op=Average: held(N) = the larger gathered output (small's, N x 404,000) plus
# the larger quotient (small's values, N x 400,000): N x 804,000 for N <= 4; big alone after, N x 8,040.
AUTO_TENSORS = [tensor("small", 1000, 5000), tensor("big", 10, 10**9)]


def auto_model():
    runs = [two_regime_summary(2, "auto", 1_900_000, 1_000_000 + 2 * 804_000, AUTO_TENSORS),
            two_regime_summary(8, "auto", 2_000_000, 1_000_000 + 8 * 8_040, AUTO_TENSORS)]
    return build_model(runs)


def naive_bisection(model, mode, budget, limit=1 << 20):
    """What the model did before: bisection over 1..limit, which assumes the peak grows with N."""
    low, high = 1, limit
    while high - low > 1:
        mid = (low + high) // 2
        if model.peak(mode, mid) > budget:
            high = mid
        else:
            low = mid
    return high


def test_a_budget_crossing_in_auto_is_found_by_scanning_where_bisection_misses_it():
    model = auto_model()
    assert model.base["auto"] == pytest.approx(1_000_000) and model.compute_peak["auto"] == 2_000_000
    budget = 4_000_000
    # N=3: 1,000,000 + 3 x 804,000 = 3,412,000; N=4: 4,216,000 (over); N=5: small densified,
    # 1,000,000 + 5 x 8,040 = 1,040,200, under the compute peak 2,000,000
    assert model.peak("auto", 3) == pytest.approx(3_412_000)
    assert model.peak("auto", 4) == pytest.approx(4_216_000)
    assert model.peak("auto", 5) == 2_000_000
    # big alone passes the budget when 8,040 N > 3,000,000: N=374 (1,000,000 + 374 x 8,040 = 4,006,960)
    assert model.peak("auto", 373) == pytest.approx(3_998_920) and model.peak("auto", 374) == pytest.approx(4_006_960)
    assert model.ranks_over_budget("auto", budget) == 4
    assert naive_bisection(model, "auto", budget) == 374  # the crossing bisection reports instead


def test_auto_names_where_the_collectives_take_over_and_where_compute_sets_the_peak_again():
    model = auto_model()
    # N=2: 1,000,000 + 2 x 804,000 = 2,608,000 > 2,000,000; N=5: 1,040,200 < 2,000,000
    assert model.regime_change_ranks("auto") == 2
    assert model.compute_again_ranks("auto") == 5
    assert [model.regime("auto", n) for n in (1, 2, 4, 5, 124, 125)] == \
        ["compute", "collectives", "collectives", "compute", "compute", "collectives"]  # 8,040 x 125 > 1,000,000


@pytest.mark.parametrize("margin", [1.0, 1.5])
def test_the_interval_scan_equals_a_scan_of_every_rank_count(margin):
    tensors = [tensor("a", 1000, 5000), tensor("b", 300, 40_000, "sum"), tensor("c", 10, 10**9)]
    runs = [two_regime_summary(4, "auto", 2_000_000, 1_000_000 + 4 * 1_000, tensors)]
    model = build_model(runs, margin=margin)
    limit = 3000
    for budget in (2_500_000, 3_000_000, 5_000_000, 9_000_000):
        every = next((n for n in range(1, limit + 1) if model.peak("auto", n) > budget), None)
        assert model.ranks_over_budget("auto", budget, limit) == every
    change = next((n for n in range(1, limit + 1) if model.regime("auto", n) == "collectives"), None)
    assert model.regime_change_ranks("auto", limit) == change


def test_summaries_without_the_split_peaks_keep_one_regime():
    model = build_model([summary(n, "sparse", 1e9 + 2 * n * per_rank()) for n in (2, 4)])
    table = prediction_table(model, [8], ["sparse"])
    assert model.compute_peak == {} and table["regime_change_ranks"] == {"sparse": None}
    assert table["rows"][0]["regime"] is None and table["compute_peak_bytes"] == {"sparse": None}


def test_as_written_keeps_what_the_script_asked_for():
    emb = [{**tensor("emb", ROWS, DENSE_ROWS), "script_sparse_as_dense": True}, tensor("side", 10, 10**6)]
    model = build_model([two_regime_summary(4, "as-written", 1_000_000, 2_000_000, emb)])
    assert model.gathered_bytes("as-written", 8) == 8 * 10 * 404  # only the table the script left sparse
    assert model.gathered_bytes("sparse", 8) == 8 * (ROWS + 10) * 404


def test_merged_bytes_are_predicted_from_the_largest_distinct_rows_measured():
    # GIVEN the reference embedding (T = 5000 rows of 4096 + 4 bytes, table 33945 rows) whose runs
    # recorded 1568-1663 distinct rows per rank
    def run(n: int, mode: str) -> dict:
        shape = dict(local_rows=5000, row_bytes=4096, index_bytes=4, dense_rows=33945, row_elements=1024)
        return {"world_size": n, "mode": mode, "peak_rss_bytes_max": 1e9, "ranks": [],
                "policy": [{"name": "emb", "decision": "sparse", **shape}],
                "distinct_rows": [{"name": "emb", "rows_max": 5000, "distinct_rows_min": 1568,
                                   "distinct_rows_max": 1663}],
                "collectives": []}

    model = build_model([run(2, "sparse"), run(4, "sparse"), run(4, "dedup")])
    # THEN dedup gathers N x 1663 x 4100 bytes (8 ranks: 54,546,400), sparse N x 5000 x 4100
    assert model.collective_bytes("dedup", 8) == 54_546_400
    assert model.collective_bytes("sparse", 8) == 164_000_000
    # AND auto merges while N x ceil(1663 x 1.25) = N x 2079 rows stay within the table (139,038,720 B):
    # 16 x 2079 x 4100 = 136,382,400 merged; 17 ranks would gather 144,906,300, so dense from 17
    assert model.collective_bytes("auto", 16) == 16 * 1663 * 4100
    assert model.collective_bytes("auto", 17) == 33945 * 4096
    assert 16 in model.switch_points("auto") and 17 in model.switch_points("auto")
    # AND MPI's 32-bit counts: 1663 x 1024 elements per rank merged, 5000 x 1024 gathered whole
    table = prediction_table(model, [8], ["sparse", "dedup"])
    assert table["count_overflow"]["emb"] == (2**31 - 1) // (5000 * 1024) + 1 == 420
    assert table["count_overflow_merged"]["emb"] == (2**31 - 1) // (1663 * 1024) + 1 == 1262
    assert "emb: merged values (U rows per rank) pass it at N = 1262" in notes(table).plain
