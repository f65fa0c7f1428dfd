"""A long run stays small on disk and is read back whole: per-step aggregates of RSS, samples of some
steps, collectives compact after the first steps; the reader gives back what a run written in full gives."""

from __future__ import annotations

import json
import random
import re
import tracemalloc
from pathlib import Path
from unittest import mock

import pytest

from memdiag.agent import tracer as tracer_module
from memdiag.agent.tracer import Tracer
from memdiag.analyze.collective_table import collective_summary
from memdiag.analyze.rank_summary import rank_summary
from memdiag.analyze.summary import summarize
from memdiag.format import layout
from memdiag.format import writer as record_writer
from memdiag.format.layout import FULL_STEPS, keeps_series
from memdiag.format.reader import CollectiveLog, RankRecords, Run, load_run, mem_points, read_rank_file
from memdiag.format.writer import RecordWriter
from memdiag.report.plots import rss_series
from memdiag.report.trace import chrome_trace
from tests.unit.fake_run import meta

MiB = 2**20
KERNELS = [f"m/layer_{i}/kernel:0" for i in range(8)]


class Clock:
    """Stands in for ``time`` in the tracer: 1 ms later at every reading, so that two runs written one
    after the other are the same to the microsecond. The record writer reads it without moving it."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        self.now += 0.001
        return self.now


class StillClock:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def time(self) -> float:
        return self.clock.now


class ScriptedSampler:
    """Stands in for the RSS sampler: 40 samples spread evenly since the last step ended, climbing in
    step 0 (partly inside its collective window), flat with small wiggles later."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.step = -1
        self.last = clock.now - 0.040

    def take_step(self, until: float | None = None) -> tuple[int, list[float], list[int]]:
        assert until is None, "scripted for steps ended when they end (no native marks read late)"
        k = 40
        span = (self.clock.now - self.last) / k
        times = [self.last + span * (i + 1) for i in range(k)]
        self.last = self.clock.now
        base = 500 * MiB if self.step < 0 else 800 * MiB
        rss = [base + (i * MiB if self.step <= 0 else (i % 5) * 4096) for i in range(k)]
        self.step += 1
        return max(rss), times, rss

    def restart_peak(self) -> None:
        pass

    def mark_now(self) -> None:  # the scripted series stands for every sample, the marks' too
        pass

    def add_marks(self, times: list[float], pages: list[int]) -> None:
        pass


class NoMark:
    """A high-water mark that never reads the kernel's (records that do not depend on this process)."""

    resettable = False

    def start(self) -> None:
        pass

    def peak(self) -> None:
        return None

    def run_peak(self, read: bool = True) -> int:
        return 0


@pytest.fixture(autouse=True)
def _heap_alike(monkeypatch):
    """The C library's figure of its heaps' freed bytes, alike in every run these tests compare line by line,
    and read at every step (the reads' budget follows the steps' real time)."""
    from memdiag.agent import heap

    monkeypatch.setattr(heap, "free_bytes", lambda: 3 * 2**20)
    monkeypatch.setattr(tracer_module, "HEAP_BUDGET", float("inf"))


def write_run(path: Path, steps: int, world_size: int = 2, kernels: list[str] = KERNELS) -> Path:
    """A run of ``steps`` steps written by memdiag's tracer: per step an allreduce of each of
    ``kernels`` and an embedding gathered as values and indices whose row count changes every 7th step."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"workload": "transformer", "preset": "tiny", "mode": "sparse",
                                               "world_size": world_size, "steps": steps, "status": "ok"}))
    for rank in range(world_size):
        clock = Clock()
        with mock.patch.object(tracer_module, "time", clock), mock.patch.object(record_writer, "time", StillClock(clock)), \
                mock.patch.object(tracer_module, "HighWaterMark", NoMark):
            writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
            tracer = Tracer(writer, ScriptedSampler(clock), rank, auto_steps=False)  # type: ignore[arg-type]
            writer.write_now({"type": "start", "size": world_size, "host": "h"})
            tracer.collective(meta("broadcast", "m/emb:0"), [64, 8], [64, 8])
            tracer.end_step(-1)
            for step in range(steps):
                tracer.begin_step(step)
                rows = 48 if step % 7 == 3 else 32
                grad = {"gradient": True, "reduce_op": "average", "process_set_size": world_size}
                values = {**meta("allgather", "m/emb:0", "values", sparse=True), **grad}
                tracer.begin_collective(values, 0)
                tracer.collective(values, [rows, 8], [world_size * rows, 8])
                tracer.collective({**meta("allgather", "m/emb:0", "indices", sparse=True, dtype="int32"), **grad},
                                  [rows], [world_size * rows])
                for name in kernels:
                    tracer.collective({**meta("allreduce", name), **grad}, [8, 8], [8, 8])
                tracer.end_step(step, loss=5.0 - step / steps, items=rows, param_digest=f"d{step}")
            writer.write_now({"type": "end", "status": "ok", "error": None, "hwm_bytes": 900 * MiB})
            writer.close()
    return path


def written_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the ranks write as they did before compaction: every collective in full, every series."""
    monkeypatch.setattr(record_writer, "FULL_STEPS", 10**9)
    monkeypatch.setattr(layout, "keeps_series", lambda step: True)


def by_type(path: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        found.setdefault(record["type"], []).append(record)
    return found


def test_after_the_first_steps_a_step_takes_a_few_hundred_bytes(tmp_path):
    short, long = 100, 400
    sizes = {n: (write_run(tmp_path / f"s{n}", n, world_size=1) / "rank-0.jsonl").stat().st_size
             for n in (short, long)}
    per_step = (sizes[long] - sizes[short]) / (long - short)
    full = write_run(tmp_path / "first", FULL_STEPS, world_size=1) / "rank-0.jsonl"
    per_full_step = full.stat().st_size / FULL_STEPS
    # one step record, one mem record of aggregates, one record of 10 collective calls
    assert per_step < 1500 and per_step < per_full_step / 3, (per_step, per_full_step)
    records = by_type(tmp_path / f"s{long}" / "rank-0.jsonl")
    assert len(records["collective"]) == 1 + 10 * FULL_STEPS  # the set-up's broadcast and the first steps
    assert {r["step"] for r in records["collective_calls"]} == set(range(FULL_STEPS, long))
    assert len(records["mem"]) == long + 1 and all("n" in m and "rss_max" in m for m in records["mem"])
    kept = [m["step"] for m in records["mem"] if "times" in m]
    assert kept == [s for s in range(-1, long) if keeps_series(s)]
    assert len(kept) < FULL_STEPS + 1 + 16 * 4  # 32..63, 64..127, 128..255, 256..399


def test_the_series_kept_are_the_first_steps_then_sixteen_per_doubling():
    kept = [s for s in range(-1, 10_000) if keeps_series(s)]
    assert kept[:FULL_STEPS + 1] == list(range(-1, FULL_STEPS))
    assert kept[FULL_STEPS + 1:FULL_STEPS + 4] == [32, 34, 36] and 64 in kept and 66 not in kept
    assert len([s for s in kept if 1024 <= s < 2048]) == 16
    assert len(kept) < 200


def test_a_compact_run_reads_back_as_the_same_records_and_summary(tmp_path, monkeypatch):
    steps = 120
    compact = load_run(str(write_run(tmp_path / "compact", steps)))
    with monkeypatch.context() as m:
        written_in_full(m)
        full = load_run(str(write_run(tmp_path / "full", steps)))
    assert not compact.warnings and not full.warnings
    for rank in (0, 1):
        ours, theirs = list(compact.ranks[rank].collectives), list(full.ranks[rank].collectives)
        assert len(ours) == len(theirs) == 1 + 10 * steps
        for a, b in zip(ours, theirs):
            assert abs(a.pop("t") - b.pop("t")) < 1e-6  # compact times are kept to the microsecond
            assert a == b
        varying = [c for c in ours if c["name"] == "m/emb:0" and c["step"] % 7 == 3 and c["step"] >= FULL_STEPS]
        assert varying and all(c["shape_in"][0] == 48 and c["bytes_out"] == 2 * 48 * 8 * 4
                               for c in varying if c["part"] == "values")
        assert compact.ranks[rank].steps == full.ranks[rank].steps
    assert summarize(compact) == summarize(full)
    assert summarize(compact)["ranks"][0]["collective_rise_bytes"] > 0


def test_phases_from_aggregates_match_phases_from_every_sample(tmp_path, monkeypatch):
    """The same records read twice: once with the samples of every step, once with those of the steps
    after the first 32 taken out (only their aggregates left): the steady figures agree."""
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        written_in_full(m)
        write_run(run_dir, 80)
    assert all("times" in r for r in by_type(run_dir / "rank-0.jsonl")["mem"])
    full = summarize(load_run(str(run_dir)))
    for rank in (0, 1):
        path = run_dir / f"rank-{rank}.jsonl"
        lines = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["type"] == "mem" and record["step"] >= FULL_STEPS:
                record.pop("times", None)
                record.pop("rss", None)
            lines.append(json.dumps(record))
        path.write_text("\n".join(lines) + "\n")
    thinned = summarize(load_run(str(run_dir)))
    assert thinned["ranks"] == full["ranks"]
    assert thinned["ranks"][0]["collective_rise_bytes"] > 0


def test_records_written_before_aggregation_are_aggregated_and_thinned_when_read(tmp_path, monkeypatch):
    steps = 90
    compact = summarize(load_run(str(write_run(tmp_path / "now", steps))))
    with monkeypatch.context() as m:
        written_in_full(m)
        m.setattr(layout, "mem_aggregates", lambda *a, **k: {})  # the old mem record: samples only
        old_dir = write_run(tmp_path / "old", steps)
    assert all("n" not in r for r in by_type(old_dir / "rank-0.jsonl")["mem"])
    old = load_run(str(old_dir))
    memory = old.ranks[0].memory
    assert [m["step"] for m in memory if "times" in m] == [s for s in range(-1, steps) if keeps_series(s)]
    assert all(m["n"] == 40 and m["rss_max"] >= m["rss_min"] for m in memory)
    assert summarize(old)["ranks"][0]["compute_peak_rss_bytes"] == compact["ranks"][0]["compute_peak_rss_bytes"]
    assert summarize(old)["ranks"][0]["collective_rise_bytes"] == compact["ranks"][0]["collective_rise_bytes"]


def test_reading_holds_memory_for_steps_not_for_collectives(tmp_path):
    """Forty more collectives a step cost the reader a few numbers each, not a record each."""
    held, as_dicts = {}, {}
    steps = 300
    for extra in (0, 40):
        kernels = KERNELS + [f"m/extra_{i}/kernel:0" for i in range(extra)]
        run_dir = write_run(tmp_path / f"k{extra}", steps, world_size=1, kernels=kernels)
        tracemalloc.start()
        run = load_run(str(run_dir))
        held[extra] = tracemalloc.get_traced_memory()[0]
        records = list(run.ranks[0].collectives)
        as_dicts[extra] = tracemalloc.get_traced_memory()[0] - held[extra]
        tracemalloc.stop()
        assert len(records) == 1 + (10 + extra) * steps
        del run, records
    per_collective = (held[40] - held[0]) / (40 * steps)
    as_dict = (as_dicts[40] - as_dicts[0]) / (40 * steps)
    assert per_collective < 60 and as_dict > 10 * per_collective, (per_collective, as_dict)


def test_a_rank_killed_mid_step_leaves_its_last_collectives(tmp_path):
    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    tracer = Tracer(writer, ScriptedSampler(Clock()), 0, auto_steps=False)  # type: ignore[arg-type]
    for step in range(FULL_STEPS + 2):
        tracer.begin_step(step)
        for name in KERNELS:
            tracer.collective(meta("allreduce", name), [8, 8], [8, 8])
        tracer.end_step(step)
    tracer.begin_step(FULL_STEPS + 2)
    tracer.collective(meta("allreduce", KERNELS[0]), [8, 8], [8, 8])
    tracer.collective(meta("allgather", "m/new:0", "values", sparse=True), [3, 8], [6, 8])  # a new kind
    tracer.collective(meta("allreduce", KERNELS[1]), [8, 8], [8, 8])
    writer.write_now({"type": "killed", "reason": "mem-limit", "step": FULL_STEPS + 2})
    records = read_rank_file(str(tmp_path / "rank-0.jsonl"), 0)
    last = [(c["step"], c["name"]) for c in records.collectives[-3:]]
    assert last == [(FULL_STEPS + 2, KERNELS[0]), (FULL_STEPS + 2, "m/new:0"), (FULL_STEPS + 2, KERNELS[1])]
    assert records.killed is not None


def test_a_call_whose_kind_was_never_read_is_counted_not_guessed(tmp_path):
    run_dir = write_run(tmp_path / "run", FULL_STEPS + 5, world_size=1)
    path = run_dir / "rank-0.jsonl"
    lines = [line for line in path.read_text().splitlines()
             if not ('"collective"' in line and re.search(r'"kind":3[,}]', line))]  # kind 3's full records
    path.write_text("\n".join(lines) + "\n")
    run = load_run(str(run_dir))
    assert run.ranks[0].collectives.unknown_calls == 5
    assert any("collective call(s)" in w for w in run.warnings)


def test_the_collective_log_is_a_sequence_of_records():
    records = [{"type": "collective", "rank": 0, "t": 1.5 + i, "step": i // 2, "op": "allreduce",
                "name": f"k{i % 2}", "part": None, "shape_in": [4], "shape_out": [4], "bytes_in": 16,
                "bytes_out": 16} for i in range(6)]
    odd = {"type": "collective", "step": 3, "name": "no shapes"}
    log = CollectiveLog([*records, odd])
    assert len(log) == 7 and log[0] == records[0] and log[-1] == odd and log[-2] == records[-1]
    assert log[1:3] == records[1:3] and list(log) == [*records, odd] and log == [*records, odd]
    assert records[0]["step"] == 0  # the records given are not changed
    with pytest.raises(IndexError):
        log[7]
    assert not CollectiveLog() and len(log._statics) == 2


def reference_collective_summary(run: Run) -> list[dict]:
    """collective_summary record by record, as it was written before records were held compactly."""
    groups: dict[tuple, list[dict]] = {}
    for records in run.ranks.values():
        for c in records.collectives:
            if c.get("step", 0) >= 0:
                groups.setdefault((c["name"], c["op"], c.get("part")), []).append(c)
    entries = []
    for (name, op, part), calls in groups.items():
        last = calls[0]
        for c in calls:  # the call shown: the largest by bytes out, the last of equals
            if c["bytes_out"] >= last["bytes_out"]:
                last = c
        steps = {(c["rank"], c["step"]) for c in calls}
        entries.append({
            "name": name, "op": op, "part": part, "sparse": bool(last.get("sparse")),
            "densified": bool(last.get("densified")), "merged": bool(last.get("merged")),
            "reduce_op": last.get("reduce_op"),
            "process_set_size": last.get("process_set_size"), "dtype": last.get("dtype"),
            "shape_in": last.get("shape_in"), "shape_out": last.get("shape_out"),
            "rows_in": (last.get("shape_in") or [None])[0], "rows_out": (last.get("shape_out") or [None])[0],
            "bytes_in_per_rank": max(c["bytes_in"] for c in calls),
            "bytes_out_per_rank": max(c["bytes_out"] for c in calls),
            "bytes_out_mean": sum(c["bytes_out"] for c in calls) / len(calls),
            "calls_per_step": len(calls) / max(1, len(steps))})
    entries.sort(key=lambda e: (-e["bytes_out_per_rank"], e["name"], e["part"] or ""))
    return entries


def test_per_tensor_and_per_rank_figures_agree_with_reading_record_by_record():
    rng = random.Random(7)
    for trial in range(40):
        ranks = {}
        for rank in range(rng.randrange(1, 4)):
            records = []
            for step in sorted(rng.randrange(-1, 30) for _ in range(rng.randrange(0, 40))):
                name, part = rng.choice([("a", None), ("b", "values"), ("b", "indices"), ("c", None)])
                rows = rng.choice([4, 8, 16])
                record = {"type": "collective", "rank": rank, "t": 1.0 + step, "step": step,
                          "op": "allgather" if part else "allreduce", "name": name, "part": part,
                          "dtype": rng.choice(["float32", "float16"]), "shape_in": [rows], "shape_out": [2 * rows],
                          "bytes_in": 4 * rows, "bytes_out": 8 * rows}
                if part and rng.random() < 0.3:
                    record["merged"] = True  # dedup: duplicate rows summed before the allgather
                if rng.random() < 0.1:
                    del record["t"], record["shape_in"]  # kept whole by the log
                records.append(record)
            ranks[rank] = RankRecords(rank, collectives=CollectiveLog(records),
                                      steps=[{"step": s, "step_time_s": 1.0} for s in range(rng.randrange(0, 30))])
        run = Run("x", {}, ranks)
        assert collective_summary(run) == reference_collective_summary(run), trial
        for records in ranks.values():
            step_ids = {s["step"] for s in records.steps}
            per_op = {}
            for c in records.collectives:
                if c.get("step") in step_ids:
                    per_op[c["op"]] = per_op.get(c["op"], 0) + c["bytes_out"]
            n = max(1, len(step_ids))
            figures = rank_summary(records)
            assert figures["allgather_bytes_per_step"] == per_op.get("allgather", 0) // n
            assert figures["collective_bytes_per_step"] == sum(per_op.values()) // n


def test_plots_and_traces_read_aggregates_where_samples_were_not_kept(tmp_path):
    run = load_run(str(write_run(tmp_path / "run", 300, world_size=1)))
    aggregated = next(m for m in run.ranks[0].memory if "times" not in m)
    points = mem_points(aggregated)
    assert points == sorted(points) and {r for _, r in points} == \
        {aggregated["rss_first"], aggregated["rss_max"], aggregated["rss_last"]}
    series = rss_series(run.ranks[0].memory, limit=500)
    assert len(series) <= 500 and max(r for _, r in series) == max(m["rss_max"] for m in run.ranks[0].memory)
    trace, _ = chrome_trace(run)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert max(e["args"]["bytes"] for e in counters) == max(m["rss_max"] for m in run.ranks[0].memory)


def _collectives_written(path: Path, reuse_metas: bool, steps: int = FULL_STEPS + 8) -> list[str]:
    """The lines a tracer writes for a step of one gathered embedding and 8 all-reduces, each call with
    the meta of its call site (as the hooks give inside a graph) or a new copy each call (eager)."""
    grad = {"gradient": True, "reduce_op": "average", "process_set_size": 2}
    sites = [{**meta("allgather", "m/emb:0", "values", sparse=True), **grad},
             *({**meta("allreduce", name), **grad} for name in KERNELS)]
    clock = Clock()
    with mock.patch.object(tracer_module, "time", clock), mock.patch.object(record_writer, "time", StillClock(clock)), \
            mock.patch.object(tracer_module, "HighWaterMark", NoMark):
        writer = RecordWriter(str(path), 0)
        tracer = Tracer(writer, ScriptedSampler(clock), 0, auto_steps=False)  # type: ignore[arg-type]
        tracer.end_step(-1)
        for step in range(steps):
            tracer.begin_step(step)
            rows = 48 if step % 7 == 3 else 32
            for site in sites:
                called = site if reuse_metas else dict(site)
                shapes = ([rows, 8], [2 * rows, 8]) if site["op"] == "allgather" else ([8, 8], [8, 8])
                tracer.collective(called, *shapes)
            tracer.end_step(step)
        writer.close()
    assert len(tracer._kind_keys) <= tracer_module.KIND_KEYS_KEPT
    return path.read_text().splitlines()


def test_a_call_sites_kind_is_remembered_and_the_records_are_those_of_fresh_metas(tmp_path, monkeypatch):
    # the tracer remembers a call site's kind key instead of recomputing it from every record
    reused = _collectives_written(tmp_path / "reused.jsonl", reuse_metas=True)
    fresh = _collectives_written(tmp_path / "fresh.jsonl", reuse_metas=False)
    assert reused == fresh
    assert any('"type":"collective_calls"' in line for line in reused)
    # eager calls make a new meta each: what the tracer remembers stays bounded
    monkeypatch.setattr(tracer_module, "KIND_KEYS_KEPT", 5)
    assert _collectives_written(tmp_path / "bounded.jsonl", reuse_metas=False) == fresh
