import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.formula import SparseGradientShape, crossover_ranks, dense_bytes, gathered_bytes
from memdiag.policy import decide


def test_gathered_bytes_grow_linearly_with_ranks_and_dense_bytes_do_not():
    # GIVEN the design probe's embedding: 16384 rows per rank of 1024 float32, int64 indices
    per_rank = 16384 * (1024 * 4 + 8)
    # THEN each rank receives N times one rank's rows
    assert gathered_bytes(8, 16384, 4096, 8) == 8 * per_rank
    assert gathered_bytes(8, 16384, 4096, 8) - gathered_bytes(4, 16384, 4096, 8) == 4 * per_rank
    assert dense_bytes(32000, 4096) == 32000 * 4096


def test_crossover_is_where_gathered_equals_dense():
    # 5000 rows of 4096 + 8 bytes: 20,520,000 B per rank gathered; the table 33945 x 4096 = 139,038,720 B
    n = crossover_ranks(rows_per_rank=5000, row_bytes=4096, index_bytes=8, dense_rows=33945)
    assert n == pytest.approx(139_038_720 / 20_520_000)  # 6.776: N=6 gathers 123,120,000, N=7 143,640,000
    assert crossover_ranks(rows_per_rank=0, row_bytes=4096, index_bytes=8, dense_rows=33945) == float("inf")


def test_modes_sparse_and_dense_ignore_sizes():
    shape = SparseGradientShape(rows_per_rank=10, row_bytes=16, index_bytes=8, dense_rows=1_000_000)
    assert not decide("sparse", "emb", 64, shape).densify
    assert decide("dense", "emb", 64, shape).densify


def test_auto_keeps_a_truly_sparse_table_and_densifies_an_assumed_sparse_one():
    huge_table = SparseGradientShape(rows_per_rank=64, row_bytes=128, index_bytes=8, dense_rows=300_000)
    small_vocab = SparseGradientShape(rows_per_rank=4096, row_bytes=512, index_bytes=8, dense_rows=2048)
    assert not decide("auto", "side", 4, huge_table).densify
    d = decide("auto", "words", 4, small_vocab)
    assert d.densify and d.gathered_bytes == 4 * 4096 * 520 and d.dense_bytes == 2048 * 512
    assert "auto:" in d.reason


def test_auto_without_known_rows_keeps_horovods_path_and_says_why():
    d = decide("auto", "emb", 4, None)
    assert not d.densify and "unknown" in d.reason


def test_margin_delays_densifying():
    shape = SparseGradientShape(rows_per_rank=100, row_bytes=100, index_bytes=0, dense_rows=300)
    assert decide("auto", "t", 4, shape).densify  # 40000 > 30000
    assert not decide("auto", "t", 4, shape, margin=2.0).densify  # 40000 <= 60000


@given(
    n=st.integers(1, 4096),
    rows=st.integers(0, 10**6),
    row_bytes=st.integers(1, 65536),
    index_bytes=st.sampled_from([4, 8]),
    dense_rows=st.integers(1, 10**7),
)
def test_auto_is_never_worse_than_the_better_of_sparse_and_dense(n, rows, row_bytes, index_bytes, dense_rows):
    d = decide("auto", "t", n, SparseGradientShape(rows, row_bytes, index_bytes, dense_rows))
    # the sizes from their definitions, not from the formula's functions
    gathered, dense = n * rows * (row_bytes + index_bytes), dense_rows * row_bytes
    assert (dense if d.densify else gathered) == min(dense, gathered)


def test_merged_bytes_gather_the_distinct_rows_only():
    # GIVEN the reference embedding (5000 tokens, rows of 1024 float32, int32 ids), 1633 distinct ids
    from memdiag.formula import merged_bytes

    # THEN merging gathers N x 1633 rows of 4096 + 4 bytes: 8 x 1633 x 4100 = 53,562,400 at N = 8
    assert merged_bytes(8, 1633, 4096, 4) == 53_562_400
    shape = SparseGradientShape(5000, 4096, 4, 33945, 1024, distinct_rows=1633)
    assert shape.merged(8) == 53_562_400 and shape.gathered(8) == 164_000_000
    assert SparseGradientShape(5000, 4096, 4, 33945).merged(8) is None  # U not measured


def test_auto_merges_between_the_two_crossovers_at_the_reference_sizes():
    # dense 33945 x 4096 = 139,038,720 B. Unmerged: 5000 x 4100 = 20.5 MB per rank, passes dense at N = 7.
    # Merged with U = 1633 x guard 1.25 -> 2042 rows = 8,372,200 B per rank: passes dense at N = 17.
    shape = SparseGradientShape(5000, 4096, 4, 33945, 1024, distinct_rows=1633)
    assert [decide("auto", "e", n, shape).reduction for n in (1, 7, 16, 17)] == ["dedup", "dedup", "dedup", "dense"]
    d = decide("auto", "e", 16, shape)
    assert d.guarded_merged_bytes == 16 * 2042 * 4100 and d.merged_bytes == 16 * 1633 * 4100
    assert d.as_record()["decision"] == "dedup" and d.as_record()["distinct_rows"] == 1633
    assert d.as_record()["dedup_guard"] == 1.25 and "guard 1.25" in d.reason


def test_the_guard_keeps_allgather_when_merging_saves_little():
    # U = 900 of T = 1000: guarded 1125 -> capped at 1000 = T, so merging would gather as much: allgather
    shape = SparseGradientShape(1000, 64, 4, 10**6, 16, distinct_rows=900)
    assert decide("auto", "e", 4, shape).reduction == "sparse"
    assert decide("auto", "e", 4, shape, guard=1.0).reduction == "dedup"


def test_mode_dedup_merges_whatever_the_sizes():
    shape = SparseGradientShape(rows_per_rank=10, row_bytes=16, index_bytes=8, dense_rows=4)
    d = decide("dedup", "emb", 64, shape)
    assert d.merge and not d.densify and d.overridden and d.reduction == "dedup"


@given(
    n=st.integers(1, 4096),
    rows=st.integers(0, 10**6),
    distinct_fraction=st.floats(0.0, 1.0),
    row_bytes=st.integers(1, 65536),
    index_bytes=st.sampled_from([4, 8]),
    dense_rows=st.integers(1, 10**7),
)
def test_auto_picks_the_cheapest_of_three_with_u_times_the_guard(n, rows, distinct_fraction, row_bytes,
                                                                  index_bytes, dense_rows):
    import math

    from memdiag.policy import DEDUP_GUARD

    distinct = int(rows * distinct_fraction)
    shape = SparseGradientShape(rows, row_bytes, index_bytes, dense_rows, distinct_rows=distinct)
    d = decide("auto", "t", n, shape)
    # computed here from the definitions, not from the policy's helpers
    planned = min(rows, math.ceil(distinct * DEDUP_GUARD))
    costs = {"sparse": n * rows * (row_bytes + index_bytes), "dedup": n * planned * (row_bytes + index_bytes),
             "dense": dense_rows * row_bytes}
    assert costs[d.reduction] == min(costs.values())


def test_padding_bytes_of_mwms_gathers_worked_out_by_hand():
    from memdiag.formula import padding_bytes

    # 256 float32 per row (1024 B) and int32 indices (4 B): 1028 B a row gathered.
    # N=2, rows 1000 and 1500: 2 x 1500 - 2500 = 500 zero rows = 514,000 B.
    assert padding_bytes([1000, 1500], 1024, 4) == 514_000
    # N=4, rows 1000, 1500, 2000, 2500: 4 x 2500 - 7000 = 3000 zero rows = 3,084,000 B.
    assert padding_bytes([1000, 1500, 2000, 2500], 1024, 4) == 3_084_000
    # equal rows, one worker, no worker: nothing padded
    assert padding_bytes([700, 700, 700], 1024, 4) == 0
    assert padding_bytes([1234], 1024, 4) == 0
    assert padding_bytes([], 1024, 4) == 0
    # the padding is the gather of N x max rows less the rows there are: 4 x 2500 x 1028 = 10,280,000 B
    # gathered, 7000 x 1028 = 7,196,000 of them rows
    assert gathered_bytes(4, 2500, 1024, 4) == 10_280_000 and 10_280_000 - 7_196_000 == 3_084_000


def test_a_tf_distribute_decision_records_every_workers_rows_and_the_padding():
    from dataclasses import replace

    shape = SparseGradientShape(rows_per_rank=2500, row_bytes=1024, index_bytes=4, dense_rows=5000, row_elements=256)
    d = replace(decide("sparse", "embeddings:0", 4, shape, local_rows=1000),
                rows_per_worker=(1000, 1500, 2000, 2500), engine="tf-distribute")
    record = d.as_record()
    assert record["engine"] == "tf-distribute" and record["rows_per_worker"] == [1000, 1500, 2000, 2500]
    assert record["agreed_rows"] == 2500 and record["local_rows"] == 1000 and record["rows_total"] == 7000
    assert record["gathered_bytes"] == 4 * 2500 * 1028 == 10_280_000
    assert record["padding_bytes"] == 3000 * 1028 == 3_084_000
    assert record["dense_bytes"] == 5000 * 1024 == 5_120_000
    # Horovod's records have none of these fields
    assert not {"engine", "rows_per_worker", "padding_bytes"} & set(decide("sparse", "e", 4, shape).as_record())
