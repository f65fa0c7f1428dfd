"""The largest of N ranks (memdiag.analyze.ranks_spread): the mean over the ranks' peaks grows beside the
largest rank's, and the ranks' spread within a run says how much higher the largest of more ranks stands.

The comparison is test_live_bounds's two-table run at N = 2, 4, 8, its ranks' peaks set apart by hand: their
mean is the peak the model's buffers give, and one rank stands above the others by more at larger N.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from memdiag.analyze import compare as compare_analysis
from memdiag.analyze.ranks_spread import expected_largest_normal, largest_of_ranks_growth, pooled_sd, rank_mean, within_run
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
from tests.unit.test_live_bounds import BASE, RANK_COUNTS, STEPS, one_at_a_time, words, write_run

MiB = 2**20
D = 8 * MiB  # the ranks' offsets from their run's mean are multiples of this


def test_the_expected_largest_of_n_normal_draws_is_the_tables():
    # published values of the expected largest of n standard normal draws (order-statistics tables)
    for n, table in ((1, 0.0), (2, 0.5642), (3, 0.8463), (4, 1.0294), (8, 1.4236)):
        assert expected_largest_normal(n) == pytest.approx(table, abs=1e-4)
    assert expected_largest_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)


def test_a_runs_mean_and_spread_by_hand():
    assert rank_mean([10.0, 20.0, 30.0]) == 20.0
    assert rank_mean([10.0, None]) is None
    assert within_run([10.0, 20.0, 30.0]) == (200.0, 2)
    assert within_run([10.0]) is None
    assert pooled_sd([(200.0, 2), (50.0, 1)]) == pytest.approx(math.sqrt(250 / 3))
    # sigma 10 over N = 2 and 4: 10 x (1.0294 - 0.5642) / 2 per added rank
    assert largest_of_ranks_growth(10.0, [2, 4]) == pytest.approx(10 * (1.0294 - 0.5642) / 2, abs=1e-3)
    assert largest_of_ranks_growth(10.0, [4]) is None


def offsets(n: int) -> list[int]:
    """Every rank D below the run's mean but the last, which stands (n - 1) D above it: mean 0."""
    return [-D] * (n - 1) + [(n - 1) * D]


def spread_run(path: Path, n: int, peak: int) -> str:
    """write_run's run with rank k's every peak moved by offsets(n)[k]."""
    run = write_run(path, n, peak)
    for rank, offset in enumerate(offsets(n)):
        rank_file = run / f"rank-{rank}.jsonl"
        records = [json.loads(line) for line in rank_file.read_text().splitlines()]
        for record in records:
            for key in ("peak_rss_bytes", "sampled_peak_rss_bytes", "hwm_bytes"):
                if record.get(key) == peak:
                    record[key] = peak + offset
            if record.get("type") == "mem":
                record["rss"] = [r + offset if r == peak else r for r in record["rss"]]
        rank_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "summary.json").write_text(json.dumps(summarize(load_run(str(run))), default=str))
    return str(run)


def slope(xs: list[int], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def test_the_mean_over_the_ranks_and_the_largest_of_more_ranks_are_named_apart(tmp_path):
    # GIVEN ranks whose mean peak grows by the model's buffers, the largest of them D, 3 D and 7 D above it
    means = {n: BASE + one_at_a_time(n) for n in RANK_COUNTS}
    run_dirs = {(n, "sparse"): spread_run(tmp_path / f"n{n}-sparse", n, means[n]) for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=1)
    result = json.loads(json.dumps(result, default=str))
    counts = list(RANK_COUNTS)
    # THEN the rows carry each run's rank mean and spread, by hand
    rows = {r["world_size"]: r for r in result["rows"]}
    for n in counts:
        assert rows[n]["rank_mean_peak_rss_bytes"] == pytest.approx(means[n])
        assert rows[n]["steady_peak_rss_bytes_median"] == means[n] + (n - 1) * D
        assert rows[n]["rank_spread"] == [pytest.approx((n - 1) * D**2 + ((n - 1) * D) ** 2), n - 1]
    # AND the mean grows by the model's buffers, the largest rank by that and its offsets' growth
    assert result["rank_mean_growth_bytes_per_rank"]["sparse"] == pytest.approx(slope(counts, [means[n] for n in counts]))
    assert result["growth_bytes_per_rank"]["sparse"] == pytest.approx(
        slope(counts, [means[n] + (n - 1) * D for n in counts]))
    # AND the spread pooled over the three runs, and what it makes the largest of N grow by as normal draws
    sigma = math.sqrt(sum((n - 1) * D**2 + ((n - 1) * D) ** 2 for n in counts) / sum(n - 1 for n in counts))
    physics = result["physics"]
    assert physics["sparse_rank_sd_bytes"] == pytest.approx(sigma)
    tables = {2: 0.5642, 4: 1.0294, 8: 1.4236}
    assert physics["sparse_largest_of_ranks_growth_bytes_per_rank"] == pytest.approx(
        slope(counts, [sigma * tables[n] for n in counts]), rel=1e-3)
    # AND the verdict names the mean's growth and the largest of more ranks' share beside the largest rank's
    text = words(result)
    mean_growth = slope(counts, [means[n] for n in counts]) / MiB
    assert f"the mean over the ranks grows +{mean_growth:.3g} MiB per added rank" in text
    assert "and the largest of more ranks stands +" in text and "higher by the ranks' spread alone" in text


def test_ranks_alike_add_nothing_to_the_verdict(tmp_path):
    # GIVEN every rank at the same peak (test_live_bounds's runs)
    run_dirs = {(n, "sparse"): str(write_run(tmp_path / f"n{n}-sparse", n, BASE + one_at_a_time(n))) for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=1)
    result = json.loads(json.dumps(result, default=str))
    # THEN the mean grows as the largest does, the spread is 0, and the verdict says nothing of either
    assert result["rank_mean_growth_bytes_per_rank"]["sparse"] == pytest.approx(result["growth_bytes_per_rank"]["sparse"])
    assert result["physics"]["sparse_rank_sd_bytes"] == 0
    assert "the mean over the ranks" not in words(result)
