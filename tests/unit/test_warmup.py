"""Warm-up: a built-in workload runs more steps, up to --max-warmup, while its per-step peak has not
settled; every rank runs the same steps, and the parameters compared between modes are those after
--steps steps."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from memdiag.agreement import Agreement
from memdiag.workloads import loop


class FakeTracer:
    """Per-step peaks from a script of values, as the agent's tracer would measure them."""

    def __init__(self, peaks: list[int]) -> None:
        self.script = list(peaks)
        self.step_peaks: list[int] = []
        self.steps: list[tuple[int, bool]] = []
        self.on_step_end: list = []

    def begin_step(self, step: int) -> None:
        self.step = step

    def end_step(self, step: int, **extra) -> None:
        if step >= 0:
            self.step_peaks.append(self.script[step])
            self.steps.append((step, bool(extra.get("warmup"))))

    @contextmanager
    def own_work(self, what: str) -> Iterator[None]:
        yield


def _train(monkeypatch, peaks, steps, max_warmup, other_ranks_settled=True):
    saved_after: list[int] = []
    agreements: list[int] = []

    class OtherRank:  # memdiag.agreement's Transport: this rank and one other, settled or not
        rank, size = 0, 2

        def exchange(self, seq, payload, timeout_s):
            agreements.append(payload[1])
            return [payload, (payload[0], 0 if other_ranks_settled else 1)]

    monkeypatch.setattr(loop, "save_parameters", lambda path, variables: saved_after.append(len(tracer.steps)))
    tracer = FakeTracer(peaks)
    ctx = loop.WorkloadContext(tracer=tracer, rank=0, size=2, steps=steps, seed=1, preset="tiny", overrides={},
                               run_dir="run", check_params=False, max_warmup=max_warmup,
                               agreement=Agreement(OtherRank()))
    loop.train(ctx, variables=lambda: [], train_step=lambda step: 0.0, broadcast=lambda: None, items_per_step=1)
    return tracer.steps, saved_after, agreements


def test_steps_are_added_until_the_last_three_peaks_settle(monkeypatch):
    # 1500, 1502, 1501 (MiB) lie within 1% with no trend: settled at the fifth step
    steps, saved_after, _ = _train(monkeypatch, [1000, 1200, 1500, 1502, 1501, 1502, 1503], steps=2, max_warmup=4)
    assert steps == [(0, False), (1, False), (2, True), (3, True), (4, True)]
    assert saved_after == [2]  # parameters saved after the requested steps, before the warm-up


def test_a_growing_series_whose_first_two_steps_agree_is_warmed_up_to_the_cap(monkeypatch):
    # 1000 -> 1005 is within 1%, and the series goes on growing (the rule of memdiag.analyze.steady)
    steps, _, agreements = _train(monkeypatch, [1000, 1005, 1200, 1400, 1600, 1800], steps=2, max_warmup=4)
    assert [s for s, _ in steps] == [0, 1, 2, 3, 4, 5] and agreements == [1, 1, 1, 1]


def test_the_warm_up_is_capped(monkeypatch):
    steps, _, _ = _train(monkeypatch, [100, 200, 300, 400, 500, 600], steps=2, max_warmup=2)
    assert [s for s, _ in steps] == [0, 1, 2, 3]


def test_no_step_is_added_when_the_peaks_settled_or_no_warm_up_is_allowed(monkeypatch):
    steps, _, agreements = _train(monkeypatch, [100, 100, 100], steps=3, max_warmup=3)
    assert steps == [(0, False), (1, False), (2, False)] and agreements == [0]
    steps, _, agreements = _train(monkeypatch, [100, 200, 300], steps=2, max_warmup=0)
    assert steps == [(0, False), (1, False)] and agreements == []


def test_two_steps_are_too_few_to_have_settled(monkeypatch):
    steps, _, agreements = _train(monkeypatch, [100, 100, 100], steps=2, max_warmup=3)
    assert steps == [(0, False), (1, False), (2, True)] and agreements == [1, 0]


@pytest.mark.parametrize("settled_here", [True, False])
def test_a_rank_whose_peaks_settled_still_runs_while_another_has_not(monkeypatch, settled_here):
    # Every rank runs the same steps: the decision is the max of "not yet" over the ranks.
    peaks = [100] * 5 if settled_here else [100, 200, 300, 400, 500]
    steps, _, agreements = _train(monkeypatch, peaks, steps=3, max_warmup=2, other_ranks_settled=False)
    assert [s for s, _ in steps] == [0, 1, 2, 3, 4]
    assert agreements[0] == (0 if settled_here else 1)
