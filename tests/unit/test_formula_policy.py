from hypothesis import given, strategies as st

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
    n = crossover_ranks(rows_per_rank=5000, row_bytes=4096, index_bytes=8, dense_rows=33945)
    assert gathered_bytes(int(n), 5000, 4096, 8) <= dense_bytes(33945, 4096) < gathered_bytes(int(n) + 1, 5000, 4096, 8)


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
    shape = SparseGradientShape(rows, row_bytes, index_bytes, dense_rows)
    d = decide("auto", "t", n, shape)
    chosen = shape.dense() if d.densify else shape.gathered(n)
    assert chosen == min(shape.dense(), shape.gathered(n))
