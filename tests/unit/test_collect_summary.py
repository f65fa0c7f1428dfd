import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdiag._errors import UserError
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run, parse_records
from tests.unit.fake_run import make_run


def test_summary_bytes_per_step_follow_the_records(tmp_path):
    run = load_run(str(make_run(tmp_path / "r", world_size=4, steps=3, rows=256, width=32)))
    s = summarize(run)
    assert s["world_size"] == 4 and len(s["ranks"]) == 4
    gathered = 4 * 256 * 32 * 4 + 4 * 256 * 4  # values + int32 indices
    assert all(r["allgather_bytes_per_step"] == gathered for r in s["ranks"])
    assert all(r["allreduce_bytes_per_step"] == 32 * 32 * 4 for r in s["ranks"])
    values = next(c for c in s["collectives"] if c["part"] == "values")
    assert values["bytes_out_per_rank"] == 4 * 256 * 32 * 4 and values["rows_in"] == 256
    assert values["sparse"] and not values["densified"]
    assert s["consistency"] == {"checked_steps": 3, "ranks_identical": True, "mismatched_steps": []}


def test_dense_mode_shows_densified_allreduce_of_the_table(tmp_path):
    s = summarize(load_run(str(make_run(tmp_path / "r", mode="dense", vocab=512, width=32))))
    emb = next(c for c in s["collectives"] if c["name"] == "m/emb:0")
    assert emb["op"] == "allreduce" and emb["densified"] and emb["bytes_out_per_rank"] == 512 * 32 * 4
    assert all(r["allgather_bytes_per_step"] == 0 for r in s["ranks"])


def test_a_rank_that_died_is_reported_with_its_last_step(tmp_path):
    s = summarize(load_run(str(make_run(tmp_path / "r", steps=4, kill_rank_after=1))))
    dead = s["ranks"][1]
    assert dead["status"] == "died" and dead["last_step"] == 1 and dead["steps_completed"] == 2
    assert s["ranks"][0]["status"] == "ok"


def test_params_differing_between_ranks_are_caught(tmp_path):
    path = make_run(tmp_path / "r", steps=2)
    lines = (path / "rank-1.jsonl").read_text().splitlines()
    edited = [line.replace('"param_digest":"d1"', '"param_digest":"other"') for line in lines]
    (path / "rank-1.jsonl").write_text("\n".join(edited) + "\n")
    s = summarize(load_run(str(path)))
    assert s["consistency"]["ranks_identical"] is False and s["consistency"]["mismatched_steps"] == [1]


def test_garbage_lines_are_skipped_and_counted(tmp_path):
    path = make_run(tmp_path / "r", steps=2)
    with open(path / "rank-0.jsonl", "ab") as f:
        f.write(b"not json\n\xff\xfe\n[1,2]\n{\"no_type\": 1}\n")
    run = load_run(str(path))
    assert run.ranks[0].bad_lines == 4
    assert any("4 unreadable" in w for w in run.warnings)
    assert len(run.ranks[0].steps) == 2


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**6), noise=st.binary(max_size=64), position=st.integers(0, 10**6))
def test_reader_survives_any_truncation_or_corruption(tmp_path_factory, cut, noise, position):
    # GIVEN a real record file, truncated anywhere (a killed rank) and with random bytes spliced in
    path = make_run(tmp_path_factory.mktemp("r") / "run", world_size=1, steps=3)
    data = (path / "rank-0.jsonl").read_bytes()
    damaged = data[: cut % (len(data) + 1)]
    complete = len([line for line in damaged.split(b"\n")[:-1] if line])
    at = position % (len(damaged) + 1)
    # WHEN it is read
    records = parse_records((damaged[:at] + noise + damaged[at:]).split(b"\n"), 0)
    kept = (len(records.steps) + len(records.collectives) + len(records.memory) + len(records.policies)
            + len(list(records.side_records())) + (records.start is not None) + (records.end is not None))
    # THEN nothing raises, and the noise costs at most the one line it landed in
    assert kept >= complete - 1
    if not noise:
        # every complete line is kept; a last line cut before its newline counts only if whole
        assert complete <= kept <= complete + 1


def test_the_samplers_cost_reaches_the_summary_and_the_report_names_the_costliest_rank(tmp_path):
    import json

    from memdiag.report.terminal import sampler_cost_line

    path = make_run(tmp_path / "r", world_size=2, steps=2)
    for rank, (start, end, cpu) in enumerate([(100.0, 110.0, 0.2), (100.0, 104.0, 0.3)]):
        file = path / f"rank-{rank}.jsonl"
        records = [json.loads(line) for line in file.read_text().splitlines()]
        for record in records:
            if record["type"] == "start":
                record["t"] = start
            if record["type"] == "end":
                record.update(t=end, sampler_cpu_s=cpu)
        file.write_text("".join(json.dumps(r) + "\n" for r in records))
    s = summarize(load_run(str(path)))
    assert [(r["sampler_cpu_s"], r["agent_wall_s"]) for r in s["ranks"]] == [(0.2, 10.0), (0.3, 4.0)]
    # rank 1: 0.3 s of 4 s (7.5%) is a larger share than rank 0's 0.2 s of 10 s (2%)
    line = sampler_cost_line(s)
    assert line is not None and "0.30 s of CPU on rank 1 (7.5% of a core over its 4.0 s" in line
    # a run from before the field (no sampler_cpu_s in its end records) has no line
    assert sampler_cost_line({"ranks": [{**r, "sampler_cpu_s": None} for r in s["ranks"]]}) is None


def test_memdiag_s_own_set_up_and_mark_ops_reach_the_summary_and_the_report_names_the_largest(tmp_path):
    import json

    from memdiag.report.terminal import own_memory_line

    # GIVEN two ranks whose set-up grew RSS by 5 and 7 MiB (3 MiB of it the ring), with 40 and 44 mark ops,
    # and 300 all-reduces on each that began with a shared mark
    path = make_run(tmp_path / "r", world_size=2, steps=2)
    for rank, (setup, ops) in enumerate([(5 * 2**20, 40), (7 * 2**20, 44)]):
        file = path / f"rank-{rank}.jsonl"
        records = [json.loads(line) for line in file.read_text().splitlines()]
        for record in records:
            if record["type"] == "start":
                record.update(own_setup_rss_bytes=setup, marks_ring_bytes=3 * 2**20)
            if record["type"] == "end":
                record.update(mark_ops=ops, begins_shared=300)
        file.write_text("".join(json.dumps(r) + "\n" for r in records))
    s = summarize(load_run(str(path)))
    assert [(r["own_setup_rss_bytes"], r["marks_ring_bytes"], r["mark_ops"], r["begins_shared"]) for r in s["ranks"]] == \
        [(5 * 2**20, 3 * 2**20, 40, 300), (7 * 2**20, 3 * 2**20, 44, 300)]
    # THEN the report names the largest set-up and its rank, the ring within it, and the most mark ops
    line = own_memory_line(s)
    assert line is not None
    assert line.startswith("memdiag's own set-up grew RSS by 7 MiB on rank 1 (the largest; before step 0")
    assert "3 MiB of it the native marks' ring" in line and "it added 44 mark ops" in line
    assert "300 all-reduces of under 64 KiB (counted in each graph traced) began with their graph's one shared" in line
    # runs from before the fields have no line
    assert own_memory_line({"ranks": [{**r, "own_setup_rss_bytes": None} for r in s["ranks"]]}) is None


def test_the_mark_ops_heap_is_stated_where_the_build_measured_a_mark_op(tmp_path):
    import json

    from memdiag.report.terminal import own_memory_line

    # GIVEN two ranks with 40 and 44 mark ops, and the build's figure of 16,000 bytes a mark op on both
    path = make_run(tmp_path / "r", world_size=2, steps=2)
    for rank, ops in enumerate([40, 44]):
        file = path / f"rank-{rank}.jsonl"
        records = [json.loads(line) for line in file.read_text().splitlines()]
        for record in records:
            if record["type"] == "start":
                record.update(own_setup_rss_bytes=5 * 2**20, marks_ring_bytes=3 * 2**20)
            if record["type"] == "end":
                record.update(mark_ops=ops, mark_op_heap_bytes=16_000)
        file.write_text("".join(json.dumps(r) + "\n" for r in records))
    s = summarize(load_run(str(path)))
    assert [r["mark_op_heap_bytes"] for r in s["ranks"]] == [16_000, 16_000]
    assert [r["mark_op_resident_bytes"] for r in s["ranks"]] == [None, None]
    # THEN the report gives the most mark ops times the figure (44 x 16,000 = 704,000 bytes, 688 KiB), says
    # where the figure comes from, and where the memory sits
    line = own_memory_line(s)
    assert line is not None
    assert "it added 44 mark ops to the job's graphs (at most two per collective in each graph traced), about " \
           "688 KiB of heap at 15.6 KiB each" in line
    assert "as measured when memdiag's native marks were built for this TensorFlow, not in this run" in line
    assert "the resident memory they cost is more, with the allocator's slack" in line
    assert "in the level of every step after it" in line
    # with the build's resident figure too (30,000 bytes: 44 x 30,000 = 1,320,000 bytes, 1.26 MiB), both
    both = own_memory_line({"ranks": [{**r, "mark_op_resident_bytes": 30_000} for r in s["ranks"]]})
    assert both is not None
    assert ("about 688 KiB of heap at 15.6 KiB each and 1.26 MiB resident at 29.3 KiB each (a mark op's heap and "
            "resident memory as measured when memdiag's native marks were built for this TensorFlow, not in this "
            "run)") in both
    assert "is more, with the allocator's slack" not in both
    # without the build's figure, the line says it is not measured and how to measure it
    bare = own_memory_line({"ranks": [{**r, "mark_op_heap_bytes": None} for r in s["ranks"]]})
    assert bare is not None and "not measured" in bare and "python -m memdiag.nativemarks build" in bare


def test_memdiag_s_own_work_reaches_the_summary_and_the_report_names_the_largest_rise(tmp_path):
    import json

    from memdiag.report.terminal import own_memory_line

    # GIVEN two ranks with memdiag's own work: rank 0 two spans (rises of 3 and 12 MiB, 0.5 s and 1.5 s),
    # rank 1 one span whose peak was 40 MiB above where it began, and a set-up of 5 MiB each
    spans = {0: [(100, 103, 101, 10.0, 10.5), (200, 212, 200, 20.0, 21.5)], 1: [(300, 340, 310, 30.0, 30.25)]}
    path = make_run(tmp_path / "r", world_size=2, steps=2)
    for rank in (0, 1):
        file = path / f"rank-{rank}.jsonl"
        records = [json.loads(line) for line in file.read_text().splitlines()]
        for record in records:
            if record["type"] == "start":
                record.update(own_setup_rss_bytes=5 * 2**20, marks_ring_bytes=2**20)
        end = records.pop()
        for before, peak, after, t0, t1 in spans[rank]:
            records.append({"type": "own_work", "what": "read and save the final parameters", "step": 1,
                            "within_step": False, "t_start": t0, "t_end": t1, "rss_before_bytes": before * 2**20,
                            "peak_rss_bytes": peak * 2**20, "rss_after_bytes": after * 2**20})
        records.append(end)
        file.write_text("".join(json.dumps(r) + "\n" for r in records))
    s = summarize(load_run(str(path)))
    # THEN each rank's spans, seconds and largest rise are in the summary
    assert [(r["own_work_spans"], r["own_work_s"], r["own_work_rise_bytes"]) for r in s["ranks"]] == \
        [(2, 2.0, 12 * 2**20), (1, 0.25, 40 * 2**20)]
    # AND the report names the largest rise and its rank, after the set-up
    line = own_memory_line(s)
    assert line is not None and line.startswith("memdiag's own set-up grew RSS by 5 MiB")
    assert ("its own work (reading, hashing and saving parameters: 1 span, 0.25 s on rank 1) rose RSS by at most 40 MiB "
            "above where it began, cut out of the steps' figures") in line
    # AND a run without own work says nothing of it; one with own work but no set-up figure says only it
    none = {"ranks": [{**r, "own_work_rise_bytes": None} for r in s["ranks"]]}
    assert "own work" not in (own_memory_line(none) or "")
    only = {"ranks": [{**r, "own_setup_rss_bytes": None} for r in s["ranks"]]}
    assert (own_memory_line(only) or "").startswith("memdiag's own work (reading, hashing and saving parameters: 1 span")


def test_the_report_says_what_a_killed_rank_could_lose_only_where_its_marks_were_not_kept():
    from memdiag.report.terminal import replayed_line, sampler_cost_line

    rank = {"rank": 0, "sampler_cpu_s": 0.1, "agent_wall_s": 10.0, "record_every_s": 1.0, "marks_file": True,
            "replayed_steps": None}
    kept = sampler_cost_line({"script": "/s.py", "ranks": [rank]})
    assert kept is not None and "marks made records every 1 s" in kept and "could lose" not in kept
    # a script's rank whose marks had no file (--spool local) could lose a second of steps
    lost = sampler_cost_line({"script": "/s.py", "ranks": [{**rank, "marks_file": False}]})
    assert lost is not None and "a rank killed outright could lose up to 1 s of records" in lost
    # a built-in workload's steps drain the marks themselves
    builtin = sampler_cost_line({"script": None, "ranks": [{**rank, "marks_file": False}]})
    assert builtin is not None and "could lose" not in builtin
    # the steps made from a killed rank's marks are named
    assert replayed_line({"ranks": [rank]}) is None
    line = replayed_line({"ranks": [rank, {**rank, "rank": 1, "replayed_steps": [3, 9]}]})
    assert line is not None and "ranks killed outright: rank 1 steps 3-9" in line


def test_a_policy_record_written_before_agreed_rows_reads_as_the_rank_own_or_the_agreed_rows():
    # GIVEN policy records as ranks wrote them before agreed_rows: rows_per_rank was the agreed maximum
    # in auto (and under MultiWorkerMirroredStrategy, which names its engine) and the rank's own rows elsewhere
    old = [{"type": "policy", "rank": 1, "t": 1.0, "name": "a", "mode": "auto", "local_rows": 2000, "rows_per_rank": 5000},
           {"type": "policy", "rank": 1, "t": 1.0, "name": "b", "mode": "sparse", "rows_per_rank": 2000},
           {"type": "policy", "rank": 1, "t": 1.0, "name": "c", "mode": "dense", "engine": "tf-distribute",
            "local_rows": 2000, "rows_per_rank": 5000}]
    # WHEN they are read
    policies = {p["name"]: p for p in parse_records([json.dumps(r) for r in old], 1).policies}
    # THEN each says which rows are whose, and the old name is gone
    assert {name: (p.get("local_rows"), p.get("agreed_rows")) for name, p in policies.items()} == \
        {"a": (2000, 5000), "b": (2000, None), "c": (2000, 5000)}
    assert not any("rows_per_rank" in p for p in policies.values())
    # AND with a start record of format 1 (no format field) the same; a newer format than this memdiag
    # reads is refused in one line, saying what to do
    start = {"type": "start", "rank": 1, "t": 0.5, "size": 2}
    again = parse_records([json.dumps(r) for r in [start, *old]], 1).policies
    assert [(p.get("local_rows"), p.get("agreed_rows")) for p in again] == [(2000, 5000), (2000, None), (2000, 5000)]
    with pytest.raises(UserError, match=r"rank 1's records are in format 3, newer than this memdiag reads \(up to 2\)"):
        parse_records([json.dumps({**start, "format": 3})], 1)


def test_records_of_the_current_format_are_read_as_written():
    from memdiag.format.layout import RECORDS_FORMAT

    # a format-2 rank may write a field named like format 1's: it is not converted
    records = [{"type": "start", "rank": 0, "t": 0.0, "format": RECORDS_FORMAT},
               {"type": "policy", "rank": 0, "t": 1.0, "name": "a", "mode": "auto", "rows_per_rank": 7,
                "local_rows": 3, "agreed_rows": None}]
    [policy] = parse_records([json.dumps(r) for r in records], 0).policies
    assert (policy["rows_per_rank"], policy["local_rows"], policy["agreed_rows"]) == (7, 3, None)


def test_a_summary_of_the_first_format_reads_with_whose_rows_named_and_an_unknown_one_is_refused(tmp_path):
    # GIVEN summary.json as format 1 wrote it (no format field; rows_per_rank: in auto the agreed rows)
    import pytest

    from memdiag._errors import UserError
    from memdiag.format.rundir import SUMMARY, SUMMARY_FORMAT, read_summary

    old = {"world_size": 2, "policy": [{"name": "a", "mode": "auto", "local_rows": 2000, "rows_per_rank": 5000},
                                       {"name": "b", "mode": "sparse", "rows_per_rank": 2000}]}
    (tmp_path / SUMMARY).write_text(json.dumps(old))
    # WHEN it is read, THEN it is in the current format, each rows figure named for whose it is
    summary = read_summary(str(tmp_path))
    assert summary["format"] == SUMMARY_FORMAT == 2
    assert [(p.get("local_rows"), p.get("agreed_rows"), "rows_per_rank" in p) for p in summary["policy"]] == \
        [(2000, 5000, False), (2000, None, False)]
    # AND a summary written by what this memdiag does not know is refused in one line
    (tmp_path / SUMMARY).write_text(json.dumps({**old, "format": 7}))
    with pytest.raises(UserError, match="format 7.*read it with the memdiag that wrote it"):
        read_summary(str(tmp_path))
    # AND what summarize writes now carries the current format
    run = make_run(tmp_path / "run")
    assert summarize(load_run(str(run)))["format"] == SUMMARY_FORMAT


def test_every_line_the_writer_writes_begins_with_its_type_and_the_reader_tells_its_kind_unparsed(tmp_path):
    from memdiag.format.reader import line_kind, parse_line
    from memdiag.format.writer import RecordWriter

    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    writer.add({"step": 3, "type": "step", "peak_rss_bytes": 7})  # a record built with its type last
    writer.write_now({"type": "mem", "step": 3, "rss_last": 5})
    writer.close()
    lines = (tmp_path / "rank-0.jsonl").read_bytes().splitlines()
    assert [line_kind(line) for line in lines] == ["step", "mem"]
    assert [parse_line(line) for line in lines][0] == {"type": "step", "step": 3, "peak_rss_bytes": 7, "rank": 0,
                                                       "t": parse_line(lines[0])["t"]}
    for damaged in (b"", b'{"type":"st', b"not json", b'{"step": 1}', lines[0][:-3]):
        assert parse_line(damaged) is None
    assert line_kind(b'{"step":1,"type":"step"}') is None and parse_line(b'{"step":1,"type":"step"}') is not None


def _with_start(path, fields_by_rank):
    import json

    for rank, fields in enumerate(fields_by_rank):
        file = path / f"rank-{rank}.jsonl"
        records = [json.loads(line) for line in file.read_text().splitlines()]
        for record in records:
            if record["type"] == "start":
                record.update(fields)
        file.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_binding_the_launcher_chose_reaches_the_summary_the_report_and_a_comparison(tmp_path):
    from memdiag.analyze.compare import binding
    from memdiag.report.terminal import binding_line

    # GIVEN ranks that could each run on 1 of their host's 2 CPUs (mpirun's binding at N=2)
    bound = make_run(tmp_path / "bound", world_size=2, steps=2)
    _with_start(bound, [{"cpus_allowed": 1, "cpu_count": 2}] * 2)
    s = summarize(load_run(str(bound)))
    assert [(r["cpus_allowed"], r["cpu_count"]) for r in s["ranks"]] == [(1, 2), (1, 2)]
    # THEN the run's header says so
    line = binding_line(s)
    assert line is not None and "each could run on 1 of its host's 2 CPUs" in line
    # AND a comparison with an unbound N=4 names the CPUs by rank count
    free = make_run(tmp_path / "free", world_size=4, steps=2)
    _with_start(free, [{"cpus_allowed": 2, "cpu_count": 2}] * 4)
    unbound = summarize(load_run(str(free)))
    assert binding_line(unbound) is None
    assert binding({(2, "sparse"): s, (4, "sparse"): unbound}) == {"2": [1], "4": [2]}
    # unbound everywhere, or runs from before the field: nothing to say
    assert binding({(4, "sparse"): unbound}) is None
    older = summarize(load_run(str(make_run(tmp_path / "older", world_size=2, steps=2))))
    assert binding_line(older) is None and binding({(2, "sparse"): older}) is None
    # AND the comparison's notes say the rank counts ran different jobs per rank
    from rich.text import Text

    from memdiag.report.compare import environment_notes

    text = Text()
    environment_notes({"binding": {"2": [1], "4": [2]}}, text)
    assert "went 1 at N=2, 2 at N=4" in text.plain and "different jobs per rank" in text.plain
    text = Text()
    environment_notes({"binding": None}, text)
    assert text.plain == ""
