"""Noise without repeats: the spread between identical ranks of one run, named as such."""

from __future__ import annotations

from memdiag.analyze.compare import noise, rank_noise

MiB = 2**20


def _summary(n: int, peaks: list[int], status: str = "ok") -> dict:
    return {"world_size": n, "status": status, "ranks": [{"rank": r, "steady_peak_rss_bytes": p}
                                                         for r, p in enumerate(peaks)]}


def test_the_largest_spread_between_ranks_of_one_run_is_the_noise_floor():
    summaries = {
        (1, "sparse"): _summary(1, [900 * MiB]),  # one rank: no spread
        (2, "sparse"): _summary(2, [1000 * MiB, 1030 * MiB]),  # 30 MiB
        (4, "dense"): _summary(4, [910 * MiB, 950 * MiB, 905 * MiB, 930 * MiB]),  # 45 MiB
        (4, "auto"): _summary(4, [800 * MiB, 2000 * MiB], status="failed"),  # a failed run says nothing
    }
    assert rank_noise(summaries) == 45 * MiB
    assert rank_noise({(1, "sparse"): _summary(1, [900 * MiB])}) is None


def test_repeats_give_the_run_to_run_noise_when_they_exist():
    rows = [{"peak_spread_bytes": 12 * MiB}, {"peak_spread_bytes": None}, {"peak_spread_bytes": 20 * MiB}]
    assert noise(rows) == 20 * MiB
    assert noise([{"peak_spread_bytes": None}]) is None


def test_warm_up_steps_are_left_out_of_the_loss_comparison():
    """A run whose peaks had not settled ran more steps: its extra losses are not compared."""
    from memdiag.analyze.correctness import _losses

    settled = {"steps": 2, "steps_detail": [{"step": 0, "loss_mean": 7.5}, {"step": 1, "loss_mean": 7.4}]}
    warmed = {"steps": 2, "steps_detail": [{"step": 0, "loss_mean": 7.5}, {"step": 1, "loss_mean": 7.4},
                                           {"step": 2, "loss_mean": 7.3}]}
    assert _losses(warmed) == _losses(settled) == [7.5, 7.4]
