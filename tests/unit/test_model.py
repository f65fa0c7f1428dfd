import pytest

from memdiag.analyze.model import build_model, prediction_table
from memdiag.formula import SparseGradientShape

ROWS, ROW_BYTES, INDEX, DENSE_ROWS, WIDTH = 1000, 400, 4, 500, 100


def summary(n: int, mode: str, peak: float) -> dict:
    shape = dict(rows_per_rank=ROWS, row_bytes=ROW_BYTES, index_bytes=INDEX, dense_rows=DENSE_ROWS,
                 row_elements=WIDTH)
    gathered = n * ROWS * (ROW_BYTES + INDEX)
    return {
        "world_size": n, "mode": mode, "peak_rss_bytes_max": peak,
        "policy": [{"name": "emb", "decision": "dense" if mode == "dense" else "sparse", "world_size": n,
                    "gathered_bytes": gathered, "dense_bytes": DENSE_ROWS * ROW_BYTES, **shape}],
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


def test_collective_bytes_are_exact_per_mode():
    model = build_model([summary(2, "sparse", 1e9), summary(4, "sparse", 1.1e9)])
    assert model.collective_bytes("sparse", 300) == 1000 + 300 * per_rank()
    assert model.collective_bytes("dense", 300) == 1000 + DENSE_ROWS * ROW_BYTES
    # auto picks the smaller of the two for each tensor
    crossover = DENSE_ROWS * ROW_BYTES / per_rank()
    assert model.collective_bytes("auto", 1) == 0
    small_n = int(crossover) if int(crossover) > 1 else 1
    assert model.collective_bytes("auto", 300) == model.collective_bytes("dense", 300)
    if small_n > 1:
        assert model.collective_bytes("auto", small_n) == model.collective_bytes("sparse", small_n)


def test_budget_and_32_bit_count_limit():
    model = build_model([summary(n, "sparse", 1e9 + 2 * n * per_rank()) for n in (2, 4)])
    table = prediction_table(model, [16, 1200], ["sparse", "dense"], budget=1e9 + 2 * 100 * per_rank())
    assert table["ranks_over_budget"]["sparse"] == 101
    assert table["ranks_over_budget"]["dense"] is None
    assert table["count_overflow"]["emb"] == (2**31 - 1) // (ROWS * WIDTH) + 1
    assert SparseGradientShape(5000, 4096, 4, 33945, 1024).overflow_ranks() == 420
