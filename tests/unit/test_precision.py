"""How precisely repeats pin a growth (memdiag.analyze.precision): the median's variance, the slope's standard
error, and the repeats that would pin it to 10% of the model, alone and in a comparison's verdict.

The comparison is test_live_bounds's two-table run at N = 2, 4, 8, measured three times at each N with the
peaks set apart by hand: the repeats' spread is known, so the growth's standard error is too.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from memdiag.analyze import compare as compare_analysis
from memdiag.analyze.precision import difference_standard_error, median_variance, repeats_for, slope_standard_error, within
from tests.unit.test_live_bounds import BASE, RANK_COUNTS, STEPS, one_at_a_time, words, write_run

MiB = 2**20
# The variance of the median of n standard normal draws, tabulated (order-statistics tables, e.g. David and
# Nagaraja, "Order Statistics"): the mean of the two for n = 2; n = 4 and 6 the mean of the two middle ones.
TABLE = {1: 1.0, 2: 0.5, 3: 0.4487, 4: 0.2982, 5: 0.2868, 6: 0.2147, 7: 0.2104}


def test_the_medians_variance_is_the_tables():
    for n, table in TABLE.items():
        assert median_variance(n) == pytest.approx(table, abs=2e-4)
    # and many draws tend to pi / (2 n), the median's large-sample variance
    assert median_variance(201) == pytest.approx(math.pi / (2 * 201), rel=0.01)
    with pytest.raises(ValueError):
        median_variance(0)


def test_the_slopes_standard_error_by_hand():
    # two rank counts: the slope is (y4 - y2) / 2, so its variance is (var y2 + var y4) / 4
    se = slope_standard_error([(2.0, 10.0, 3), (4.0, 20.0, 3)])
    assert se == pytest.approx(math.sqrt((100 + 400) * TABLE[3] / 4), rel=1e-3)
    # three evenly spaced: the middle one weighs nothing, the ends 1 / (2 x spacing) each
    se = slope_standard_error([(2.0, 10.0, 5), (4.0, 99.0, 5), (6.0, 10.0, 5)])
    assert se == pytest.approx(math.sqrt(2 * 100 * TABLE[5]) / 4, rel=1e-3)
    # a row of one run, or one rank count, gives none
    assert slope_standard_error([(2.0, 10.0, 1), (4.0, 20.0, 3)]) is None
    assert slope_standard_error([(2.0, 10.0, 3), (2.0, 20.0, 3)]) is None


def test_the_repeats_that_pin_a_growth_to_a_width():
    # two standard errors of 5 against a half-width of 5: four times the repeats
    assert repeats_for(5.0, 3, 5.0) == 12
    assert repeats_for(5.0, 3, 10.0) == 3  # 2 x 5 is within 10 already
    assert repeats_for(1.0, 4, 100.0) == 4
    with pytest.raises(ValueError):
        repeats_for(1.0, 3, 0.0)


def test_within_two_standard_errors_to_the_byte():
    assert within(20.0, 10.0) and within(-20.0, 10.0) and not within(21.0, 10.0)
    # repeats alike (no spread): a fraction of a byte from the fits' arithmetic is no difference, a byte is
    assert within(1e-8, 0.0) and not within(1.0, 0.0)
    # two medians of three and of five: their difference's variance is the sum of theirs
    assert difference_standard_error([(10.0, 3), (20.0, 5)]) == pytest.approx(
        math.sqrt(100 * TABLE[3] + 400 * TABLE[5]), rel=1e-3)
    assert difference_standard_error([(10.0, 1), (20.0, 5)]) is None


OFFSETS = (-2 * 8 * MiB, 0, 3 * 8 * MiB)  # the three repeats' peaks about each N's level: sd by hand below


def test_a_comparison_with_repeats_states_its_growths_standard_error(tmp_path: Path):
    # GIVEN every rank count measured three times, its repeats' peaks the level and OFFSETS (scaled by N / 2)
    levels = {n: BASE + one_at_a_time(n) for n in RANK_COUNTS}
    run_dirs = {}
    for n in RANK_COUNTS:
        scale = n // 2
        run_dirs[(n, "sparse")] = [str(write_run(tmp_path / f"n{n}-sparse-r{i}", n, levels[n] + scale * offset))
                                   for i, offset in enumerate(OFFSETS)]
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=3)
    result = json.loads(json.dumps(result, default=str))
    # THEN each row carries its repeats' sample standard deviation
    sd = math.sqrt(((-2 - 1 / 3) ** 2 + (1 / 3) ** 2 + (3 - 1 / 3) ** 2) / 2) * 8 * MiB
    rows = {r["world_size"]: r for r in result["rows"]}
    for n in RANK_COUNTS:
        assert rows[n]["peak_sd_bytes"] == pytest.approx((n // 2) * sd)
        assert rows[n]["peak_runs"] == 3
        assert rows[n]["steady_peak_rss_bytes_median"] == levels[n]
    # AND the growth's standard error is the slope's by hand, the medians' variance the table's for three
    counts = list(RANK_COUNTS)
    mean_n = statistics.mean(counts)
    sxx = sum((n - mean_n) ** 2 for n in counts)
    by_hand = math.sqrt(sum(((n - mean_n) / sxx) ** 2 * ((n // 2) * sd) ** 2 * TABLE[3] for n in counts))
    physics = result["physics"]
    assert physics["sparse_growth_se_bytes_per_rank"] == pytest.approx(by_hand, rel=1e-3)
    assert physics["sparse_growth_repeats"] == 3
    # AND the repeats that would put two of it within 10% of k x the formula
    model = physics["predicted_rss_growth_bytes_per_rank"]
    expected = max(3, math.ceil(3 * (2 * by_hand / (0.1 * model)) ** 2))
    assert physics["sparse_growth_repeats_for_tenth"] == expected
    # AND the verdict says both, and that back-to-back runs leave a slower drift out
    text = words(result)
    assert f"Sparse's growth: \u00b1{by_hand / MiB:.3g} MiB per added rank, one standard error" in text
    assert "a slower drift of the machine is not in it" in text
    # how far the growth stands from k x the formula, in standard errors, by hand
    apart = (physics["sparse_growth_bytes_per_rank"] - model) / by_hand
    assert f"it stands {abs(apart):.1f} standard errors {'above' if apart >= 0 else 'below'} k x the formula" in text
    assert expected > 3  # the spread set by hand is wide against the model
    assert f"about {expected} repeats at each N put two standard errors within 10% of the model" in text


def test_one_run_per_rank_count_states_no_standard_error(tmp_path: Path):
    run_dirs = {(n, "sparse"): str(write_run(tmp_path / f"n{n}-sparse", n, BASE + one_at_a_time(n)))
                for n in RANK_COUNTS}
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=1)
    result = json.loads(json.dumps(result, default=str))
    assert result["physics"]["sparse_growth_se_bytes_per_rank"] is None
    assert "standard error" not in words(result)


def test_the_phrase_gives_the_distance_from_the_model_in_standard_errors():
    from memdiag.report.compare import precision_phrase

    base = {"sparse_growth_se_bytes_per_rank": 4 * MiB, "predicted_rss_growth_bytes_per_rank": 64 * MiB,
            "sparse_growth_repeats": 3, "sparse_growth_repeats_for_tenth": 48}
    above = precision_phrase({**base, "sparse_growth_bytes_per_rank": 80 * MiB})
    assert "it stands 4.0 standard errors above k x the formula" in above
    assert "about 48 repeats at each N put two standard errors within 10% of the model" in above
    below = precision_phrase({**base, "sparse_growth_bytes_per_rank": 56 * MiB, "sparse_growth_repeats_for_tenth": 3})
    assert "it stands 2.0 standard errors below k x the formula" in below
    assert below.endswith("; two standard errors are within 10% of the model.")
    assert precision_phrase({**base, "sparse_growth_se_bytes_per_rank": None}) == ""
