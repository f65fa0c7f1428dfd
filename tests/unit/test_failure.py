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
    from memdiag.format.reader import parse_records

    wait = '{"type": "waiting", "rank": 1, "t": 12.0, "step": 2, "op": "allreduce", "name": "grad_a", "part": null, "since": 10.0}'
    done = '{"type": "collective", "rank": 1, "t": 12.5, "step": 2, "op": "allreduce", "name": "grad_a", "part": null, "bytes_in": 16, "bytes_out": 16}'
    earlier = '{"type": "collective", "rank": 1, "t": 9.0, "step": 1, "op": "allreduce", "name": "grad_a", "part": null, "bytes_in": 16, "bytes_out": 16}'
    other = '{"type": "collective", "rank": 1, "t": 12.5, "step": 2, "op": "allreduce", "name": "grad_b", "part": null, "bytes_in": 16, "bytes_out": 16}'
    assert still_waiting(parse_records([earlier, wait, done], 1)) is None
    assert still_waiting(parse_records([earlier, wait, other], 1))["name"] == "grad_a"
    assert still_waiting(parse_records([earlier], 1)) is None


def test_a_rank_that_could_not_agree_is_the_headline_not_the_rank_that_saw_horovod_shut_down(tmp_path):
    import json

    from memdiag.analyze.failure import diagnose
    from memdiag.format.reader import load_run
    from tests.unit.fake_run import make_run

    # GIVEN a run whose rank 0 failed in a collective because rank 1 gave up agreeing (its cause)
    run_dir = make_run(tmp_path / "run", steps=1)
    errors = {0: "Traceback ...\n  HorovodInternalError: Horovod has been shut down.\n   [[{{node second}}]]",
              1: "Traceback ...\n    AgreementError: rank 1: the other ranks did not agree on 'traced/x' ...\n"}
    for rank, error in errors.items():
        with (run_dir / f"rank-{rank}.jsonl").open("a") as f:
            f.write(json.dumps({"type": "end", "rank": rank, "status": "error", "error": error}) + "\n")
    # THEN the headline is rank 1's, its last line without the traceback's indentation
    failure = diagnose(load_run(str(run_dir)))
    assert failure == {"kind": "error", "headline": "rank 1 failed: AgreementError: rank 1: the other ranks did "
                                                    "not agree on 'traced/x' ..."}
    # AND without an AgreementError, the lowest failed rank's
    errors[1] = "Traceback ...\nValueError: bad batch"
    for rank in (0, 1):
        with (run_dir / f"rank-{rank}.jsonl").open("a") as f:
            f.write(json.dumps({"type": "end", "rank": rank, "status": "error", "error": errors[rank]}) + "\n")
    assert diagnose(load_run(str(run_dir)))["headline"] == "rank 0 failed: [[{{node second}}]]"
