"""A comparison with ``--repeats``, end to end: real runs on 2 and 4 ranks, each twice, and a verdict that weighs
sparse's growth against two standard errors from the repeats' spread (memdiag.analyze.precision).

The expected figures are worked out here from the rows' own repeats (each run's steady peak, read from its
summary), not taken from the comparison's physics: the sample standard deviation of two runs is their
difference over sqrt(2), the median of two is their mean (variance 1/2 of one run's), and the growth over
two rank counts is the difference of the medians over the span.
"""

from __future__ import annotations

import math

import pytest

from tests.helpers import memdiag, read_json

pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.horovod, pytest.mark.timeout(1200)]


def test_a_comparison_with_repeats_weighs_its_growth_against_two_standard_errors(runs_root):
    out = runs_root / "compare-repeats"
    result = memdiag("compare", "sparse-vs-dense", "transformer", "-n", "2,4", "--modes", "sparse", "--steps", "3",
                     "--repeats", "2", "--out", str(out), timeout=1000)
    assert result.returncode == 0, result.stdout + result.stderr
    data = read_json(out / "compare.json")
    # each rank count ran twice: the rows' spread and median from the two runs' own summaries
    peaks = {}
    for row in data["rows"]:
        n = row["world_size"]
        summaries = [read_json(out / name / "summary.json") for name in (f"n{n}-sparse", f"n{n}-sparse-r2")]
        found = [s.get("steady_peak_rss_bytes_max") or s["peak_rss_bytes_max"] for s in summaries]
        assert row["peak_runs"] == 2
        assert row["peak_sd_bytes"] == pytest.approx(abs(found[0] - found[1]) / math.sqrt(2), abs=1)
        assert row["steady_peak_rss_bytes_median"] == pytest.approx(sum(found) / 2, abs=1)
        peaks[n] = found
    # THEN the growth's standard error is the two medians' over the span, each median's variance half a run's
    sd = {n: abs(a - b) / math.sqrt(2) for n, (a, b) in peaks.items()}
    se = math.sqrt(sum(s * s / 2 for s in sd.values())) / 2
    p = data["physics"]
    assert p["sparse_growth_se_bytes_per_rank"] == pytest.approx(se, rel=1e-3, abs=1)
    assert p["sparse_growth_judged_by"] == "standard_error"
    growth = (sum(peaks[4]) - sum(peaks[2])) / 2 / 2
    assert p["sparse_growth_bytes_per_rank"] == pytest.approx(growth, abs=1)
    gap = growth - p["predicted_rss_growth_bytes_per_rank"]
    assert p["sparse_growth_within_noise"] is (abs(gap) <= 2 * se + 0.5)
    [segment] = p["sparse_segments"]
    assert segment["standard_error_bytes_per_rank"] == pytest.approx(se, rel=1e-3, abs=1)
    # AND the report says what judged it
    text = " ".join(result.stdout.split())
    assert ("within two standard errors (\u00b1" if p["sparse_growth_within_noise"] else
            "beyond two standard errors (\u00b1") in text
    assert "the widest range of a row's repeats" in text
