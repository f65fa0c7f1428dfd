"""memdiag.agreement: once per key, in order, within a deadline; ranks as threads (tests/helpers.ThreadRanks)
or one rank with canned partners (CannedTransport). Under real mpirun: tests/integration/test_agreement.py."""

from __future__ import annotations

import time

import pytest

from memdiag.agreement import Agreement, AgreementError, LocalTransport, key_digest, run_deadline
from tests.helpers import CannedTransport, ThreadRanks, run_ranks


def test_every_rank_gets_every_ranks_figures_in_rank_order_and_their_largest():
    results, _ = run_ranks(3, lambda r, a: (a.gather("rows/emb", (10 * r, 7 - r)), a.max("warmup/2", (r % 2,))))
    expected_gather = ((0, 7), (10, 6), (20, 5))
    assert results == [(expected_gather, (1,))] * 3


def test_a_key_is_exchanged_once_and_a_later_call_returns_the_first_answer():
    transport = CannedTransport(0, {1: [(50,)]})
    agreement = Agreement(transport)
    assert agreement.max("rows/emb", (30,)) == (50,)
    assert agreement.max("rows/emb", (99,)) == (50,)  # a retrace with other rows: no new exchange
    assert transport.sent == [(30,)] and agreement.keys == ["rows/emb"]


def test_ranks_at_different_keys_all_raise_at_once_naming_the_key():
    # GIVEN two ranks that meet the same two tensors in opposite orders
    order = {0: ["rows/a", "rows/b"], 1: ["rows/b", "rows/a"]}
    start = time.monotonic()
    results, _ = run_ranks(2, lambda r, a: [a.gather(k, (r,)) for k in order[r]], timeout_s=20)
    # THEN both learn it at the first exchange, long before the deadline, with the key named
    assert time.monotonic() - start < 10
    for r, result in enumerate(results):
        assert isinstance(result, AgreementError)
        assert f"rank {r}: agreement 1 is on {order[r][0]!r} here but on another key on rank {1 - r}" in str(result)


def test_a_rank_whose_partners_never_ask_gives_up_at_the_deadline_and_stays_broken():
    # GIVEN rank 1 that meets one tensor more than rank 0
    keys = {0: ["rows/a"], 1: ["rows/a", "rows/extra"]}
    results, agreements = run_ranks(2, lambda r, a: [a.gather(k, (r,)) for k in keys[r]], timeout_s=0.5)
    assert results[0] == [((0,), (1,))]
    assert isinstance(results[1], AgreementError)
    assert "the other ranks did not agree on 'rows/extra' (agreement 2 of this rank) within 0.5 s" in str(results[1])
    # AND every later agreement raises the same error at once: no rank goes on alone
    with pytest.raises(AgreementError, match="rows/extra"):
        agreements[1].gather("rows/later", (1,))
    assert agreements[1].gather("rows/a", (5,)) == ((0,), (1,))  # what was agreed stays agreed


def test_one_rank_needs_no_partner_and_digests_are_stable_signed_64_bit():
    assert Agreement(LocalTransport()).max("rows/x", (4, -1)) == (4, -1)
    assert key_digest("rows/x") == key_digest("rows/x") != key_digest("rows/y")
    assert -(2**63) <= key_digest("rows/x") < 2**63


def test_the_deadline_stops_short_of_the_runs_time_limit_and_no_wait_passes_it():
    assert run_deadline(None) is None
    assert run_deadline(20, now=1000.0) == 1000.0 + 20 - 5  # a quarter of the limit for the report
    assert run_deadline(600, now=1000.0) == 1000.0 + 600 - 10  # at most 10 s
    # a rank whose partner never comes waits until then, not its full timeout
    ranks = ThreadRanks(2)
    agreement = Agreement(ranks.transport(1), timeout_s=60, until=time.time() + 0.6)
    start = time.monotonic()
    with pytest.raises(AgreementError, match=r"did not agree on 'rows/a' \(agreement 1 of this rank\) within 0\.[56]"):
        agreement.gather("rows/a", (1,))
    assert time.monotonic() - start < 5
