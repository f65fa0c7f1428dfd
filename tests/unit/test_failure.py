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
