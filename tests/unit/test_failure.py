from memdiag.analyze.failure import stalled_collectives

LOG = """
[2026-11-30 12:17:14.5: W horovod/common/stall_inspector.cc:107] One or more tensors were submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder of ranks for more than 3 seconds. This may indicate that different ranks are trying to submit different tensors or that only subset of ranks is submitting tensors, which will cause deadlock.
Missing ranks:
1: [HorovodAllreduce_grad_b_0]
3: [HorovodAllreduce_grad_b_0, HorovodAllgather_emb_0]
some other line
"""


def test_stall_report_is_parsed_per_rank():
    assert stalled_collectives(LOG) == {1: ["HorovodAllreduce_grad_b_0"],
                                        3: ["HorovodAllreduce_grad_b_0", "HorovodAllgather_emb_0"]}


def test_the_last_stall_report_wins_and_none_means_empty():
    assert stalled_collectives("") == {}
    later = LOG + "\nMissing ranks:\n2: [x]\n"
    assert stalled_collectives(later) == {2: ["x"]}


def test_a_wait_that_completed_is_not_a_hang():
    from memdiag.analyze.failure import still_waiting
    from memdiag.collect import parse_records

    wait = '{"type": "waiting", "rank": 1, "t": 12.0, "step": 2, "op": "allreduce", "name": "grad_a", "part": null, "since": 10.0}'
    done = '{"type": "collective", "rank": 1, "t": 12.5, "step": 2, "op": "allreduce", "name": "grad_a", "part": null, "bytes_in": 16, "bytes_out": 16}'
    earlier = '{"type": "collective", "rank": 1, "t": 9.0, "step": 1, "op": "allreduce", "name": "grad_a", "part": null, "bytes_in": 16, "bytes_out": 16}'
    other = '{"type": "collective", "rank": 1, "t": 12.5, "step": 2, "op": "allreduce", "name": "grad_b", "part": null, "bytes_in": 16, "bytes_out": 16}'
    assert still_waiting(parse_records([earlier, wait, done], 1)) is None
    assert still_waiting(parse_records([earlier, wait, other], 1))["name"] == "grad_a"
    assert still_waiting(parse_records([earlier], 1)) is None
