"""With repeats, a verdict weighs a difference against two standard errors from the repeats' spread, not the
widest range of a row's repeats (which widens as repeats are added); the ranks' spread term is named and counted.

The runs are test_live_bounds's two-table runs at N = 2, 4, 8 (test_compute_phase's for two modes), copied
into repeats whose summaries are moved by hand: each repeat's largest rank by an offset, and, where the ranks
spread, every other rank a fixed amount below the largest. So the repeats' standard deviation, the ranks'
pooled standard deviation and the terms built on them are known without the code under test.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from memdiag.analyze import compare as compare_analysis
from memdiag.units import format_bytes
from tests.unit.test_heap_free import one_table_run
from tests.unit.test_live_bounds import BASE, KERNEL_BYTES, RANK_COUNTS, STEPS, one_at_a_time, words, write_run

MiB = 2**20
# the variance of the median of n standard normal draws (order-statistics tables) and the expected largest of
# n (0.5642 for two, 1.0294 for four, 1.4236 for eight: tabulated, e.g. Harter's tables)
MEDIAN_VARIANCE = {9: 0.1661}
LARGEST = {2: 0.5642, 4: 1.0294, 8: 1.4236}
# nine repeats about each level, in units: their sample standard deviation is sqrt(36 / 8) units, their range 8
OFFSETS = (-4, -1, 0, 1, 0, -1, 1, 0, 4)


def repeats(base: Path, root: Path, unit: int, below: int = 0) -> list[str]:
    """Copies of the run ``base``, one per offset, each one's largest rank moved by its offset in ``unit``; with
    ``below``, every other rank's steady peak that far under the largest."""
    paths = []
    for i, offset in enumerate(o * unit for o in OFFSETS):
        path = root / f"{base.name}-r{i}"
        shutil.copytree(base, path)
        summary = json.loads((path / "summary.json").read_text())
        for key in ("steady_peak_rss_bytes_max", "peak_rss_bytes_max"):
            summary[key] += offset
        for rank in summary["ranks"]:
            rank["steady_peak_rss_bytes"] = summary["steady_peak_rss_bytes_max"] - (below if rank["rank"] else 0)
        (path / "summary.json").write_text(json.dumps(summary))
        paths.append(str(path))
    return paths


def repeated(root: Path, extra: Callable[[int], float], below: int = 0, unit: int = 8 * MiB) -> dict:
    """Sparse at N = 2, 4, 8, nine repeats each about the model's buffers and ``extra(N)``: one gathered table
    (test_heap_free's runs, their heaps level), so the model has one figure and the growth is above it or not."""
    per_rank = one_at_a_time(1) - KERNEL_BYTES  # the table's gathered values and indices and its quotient
    run_dirs = {}
    for n in RANK_COUNTS:
        base = Path(one_table_run(root / f"n{n}", n, BASE + n * per_rank + int(extra(n)), 100 * MiB))
        run_dirs[(n, "sparse")] = repeats(base, root, unit, below)
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse"], steps=STEPS, repeats=len(OFFSETS))
    return json.loads(json.dumps(result, default=str))


def slope_se(points: dict[int, float], repeats: int) -> float:
    """The least-squares slope's standard error over rank counts whose medians have variance sd^2 x m(R)."""
    mean_n = statistics.mean(points)
    sxx = sum((n - mean_n) ** 2 for n in points)
    return math.sqrt(sum(((n - mean_n) / sxx) ** 2 * sd * sd * MEDIAN_VARIANCE[repeats] for n, sd in points.items()))


SD = statistics.stdev(OFFSETS) * 8 * MiB
SE = slope_se({n: SD for n in RANK_COUNTS}, len(OFFSETS))


def test_many_repeats_judge_a_growth_by_its_standard_error_not_by_the_widest_range(tmp_path: Path):
    # GIVEN nine repeats whose range (64 MiB) exceeds the gap over N=2 to 8 (6 x 6 MiB), while two standard errors
    # of the growth are far below its 6 MiB a rank
    result = repeated(tmp_path, lambda n: 6 * MiB * n)
    p = result["physics"]
    gap = p["sparse_growth_bytes_per_rank"] - p["predicted_rss_growth_bytes_per_rank"]
    assert result["noise_bytes"] == 64 * MiB and abs(gap) * 6 <= result["noise_bytes"]  # the range says: within
    assert p["sparse_growth_se_bytes_per_rank"] == pytest.approx(SE, rel=2e-3)
    assert abs(gap) > 2 * SE
    # THEN the growth is beyond the noise, judged by its standard error, and the verdict says so with the figure
    assert p["sparse_growth_judged_by"] == "standard_error"
    assert p["sparse_growth_within_noise"] is False
    text = words(result)
    assert f"beyond two standard errors (\u00b1{format_bytes(SE)} each)" in text
    assert "within noise" not in text
    assert ("Run-to-run noise: 64 MiB, the widest range of a row's repeats; the differences above are weighed "
            "against two standard errors from the repeats' spread") in text
    # AND each segment is judged by its own two ends' standard error: sqrt(2 x sd^2 x m(9)) / span
    for s in p["sparse_segments"]:
        span = s["to_world_size"] - s["from_world_size"]
        assert s["standard_error_bytes_per_rank"] == pytest.approx(
            math.sqrt(2 * SD * SD * MEDIAN_VARIANCE[9]) / span, rel=2e-3)
        assert s["beyond_noise"] is (abs(s["unexplained_bytes_per_rank"]) > 2 * s["standard_error_bytes_per_rank"])
    assert "beyond two standard errors of the repeats" in text


def test_a_growth_on_the_model_is_within_two_standard_errors(tmp_path: Path):
    result = repeated(tmp_path, lambda n: 0)
    p = result["physics"]
    gap = p["sparse_growth_bytes_per_rank"] - p["predicted_rss_growth_bytes_per_rank"]
    assert abs(gap) <= 2 * SE  # the synthetic runs' growth is the model's within a fraction of a MiB a rank
    assert p["sparse_growth_within_noise"] is True and p["sparse_growth_within_after_named"] is None
    assert f"within two standard errors (\u00b1{format_bytes(SE)} each)" in words(result)


BELOW = 40 * MiB  # every rank but the largest this far below it, in every run
UNIT = MiB  # the repeats' offsets: two standard errors of each segment a few MiB a rank at most
SMALL_SE = slope_se({n: statistics.stdev(OFFSETS) * UNIT for n in RANK_COUNTS}, len(OFFSETS))


def ranks_sd() -> float:
    """The ranks' pooled standard deviation by hand: in a run of n ranks, one at the top and n - 1 at BELOW under
    it, the squared deviations from the mean sum to BELOW^2 (n - 1) / n over n - 1 degrees of freedom."""
    return math.sqrt(sum(BELOW**2 * (n - 1) / n for n in RANK_COUNTS) / sum(n - 1 for n in RANK_COUNTS))


def slope(values: dict[int, float]) -> float:
    """The least-squares slope over N = 2, 4, 8."""
    mean_n, mean_v = statistics.mean(values), statistics.mean(values.values())
    return (sum((n - mean_n) * (v - mean_v) for n, v in values.items())
            / sum((n - mean_n) ** 2 for n in values))


def test_a_growth_the_ranks_spread_term_accounts_for_is_said_within_with_it_counted(tmp_path: Path):
    # GIVEN ranks that spread (every rank but the largest 40 MiB under it), and the largest rank standing above
    # the model by what that spread alone lifts the largest of N ranks: sd x e(N)
    sd = ranks_sd()
    term = slope({n: sd * LARGEST[n] for n in RANK_COUNTS})
    result = repeated(tmp_path, lambda n: sd * LARGEST[n], below=BELOW, unit=UNIT)
    p = result["physics"]
    assert p["sparse_rank_sd_bytes"] == pytest.approx(sd, rel=1e-6)
    assert p["sparse_largest_of_ranks_growth_bytes_per_rank"] == pytest.approx(term, rel=2e-3)
    gap = p["sparse_growth_bytes_per_rank"] - p["predicted_rss_growth_bytes_per_rank"]
    assert gap > 2 * SMALL_SE and abs(gap - term) <= 2 * SMALL_SE
    # THEN beyond two standard errors of k x the formula, and within them with the term counted, named
    assert p["sparse_growth_within_noise"] is False and p["sparse_growth_within_after_named"] is True
    text = words(result)
    assert (f"beyond two standard errors (\u00b1{format_bytes(SMALL_SE)} each), within them with the "
            f"+{term / MiB:.3g} MiB per added rank that the ranks' spread alone adds to the largest of more ranks "
            "counted") in text
    # AND each segment's term is sd x (e(b) - e(a)) / (b - a), and no segment is called unexplained
    for s in p["sparse_segments"]:
        a, b = s["from_world_size"], s["to_world_size"]
        assert s["largest_of_ranks_bytes_per_rank"] == pytest.approx(sd * (LARGEST[b] - LARGEST[a]) / (b - a), rel=2e-3)
        assert s["beyond_noise"] is True and s["beyond_noise_after_named"] is False
    assert "unexplained" not in text
    assert text.count("that the ranks' spread alone adds to the largest of more ranks, and the rest of the gap is "
                      "within two standard errors of the repeats") == 2


def test_a_growth_beyond_the_ranks_spread_term_is_unexplained_by_what_is_left(tmp_path: Path):
    sd = ranks_sd()
    term = slope({n: sd * LARGEST[n] for n in RANK_COUNTS})
    result = repeated(tmp_path, lambda n: sd * LARGEST[n] + 10 * MiB * n, below=BELOW, unit=UNIT)
    p = result["physics"]
    assert p["sparse_growth_within_noise"] is False and p["sparse_growth_within_after_named"] is False
    text = words(result)
    assert f"and beyond them with the +{term / MiB:.3g} MiB per added rank" in text
    # each segment: unexplained by the gap less its own term, 10 MiB a rank
    for s in p["sparse_segments"]:
        assert s["beyond_noise_after_named"] is True
        left = s["unexplained_bytes_per_rank"] - s["largest_of_ranks_bytes_per_rank"]
        assert left == pytest.approx(10 * MiB, abs=0.01 * MiB)
        assert (f"unexplained: +{left / MiB:.3g} MiB per added rank between N={s['from_world_size']} and "
                f"N={s['to_world_size']}, beyond two standard errors of the repeats") in text
    # the verdict's clause and each segment's
    assert text.count("that the ranks' spread alone adds to the largest of more ranks") == 3


@pytest.mark.parametrize("apart, level", [(30 * MiB, False), (10 * MiB, True)])
def test_two_modes_peaks_are_level_or_apart_by_two_standard_errors_of_their_difference(tmp_path: Path, apart, level):
    # GIVEN sparse and dense at N = 2, 4, 8 with nine repeats each, dense below sparse at N=8 by ``apart``: inside
    # the repeats' range (64 MiB) either way, outside or inside two standard errors of the difference,
    # sqrt(2 sd^2 m(9)) = 9.8 MiB
    run_dirs = {}
    for mode, lower in (("sparse", 0), ("dense", apart)):
        for n in RANK_COUNTS:
            base = write_run(tmp_path / f"n{n}-{mode}", n, BASE + one_at_a_time(n) - lower)
            for name in ("run.json", "summary.json"):  # the same records, under dense's name
                (base / name).write_text(json.dumps({**json.loads((base / name).read_text()), "mode": mode}))
            run_dirs[(n, mode)] = repeats(base, tmp_path, 8 * MiB)
    result = compare_analysis.build("synthetic", "two-tables", run_dirs)
    result.update(rank_counts=list(RANK_COUNTS), modes=["sparse", "dense"], steps=STEPS, repeats=len(OFFSETS))
    p = json.loads(json.dumps(result, default=str))["physics"]
    assert apart < p["noise_bytes"]  # the range would call them level either way
    assert (apart <= 2 * math.sqrt(2 * SD * SD * MEDIAN_VARIANCE[9])) is level
    # THEN dense has the lowest peak, alone where they are apart, and level with sparse within noise where not
    assert p["lowest_peak_mode"] == "dense"
    assert p["lowest_peak_modes_within_noise"] == (["dense", "sparse"] if level else ["dense"])
