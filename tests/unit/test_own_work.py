"""Nothing of memdiag's own inside a measured step: rank 0's parameter save, the step-end digest and any
span marked as memdiag's own work are in no step's peak, and each is recorded with its own peak."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from memdiag.agent.sampler import MemorySampler, read_rss
from memdiag.agent.tracer import Tracer
from memdiag.agreement import Agreement, LocalTransport
from memdiag.format.writer import RecordWriter
from memdiag.workloads import loop

MiB = 1 << 20
HELD = 128 * MiB  # what memdiag's own work holds at once (a copy of a 128 MiB model)


class Parameter:
    """A variable whose value is read as a fresh copy, as TensorFlow's ``Variable.numpy()`` is."""

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size

    def numpy(self) -> np.ndarray:
        return np.ones(self.size // 4, dtype=np.float32)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tracer(path: Path) -> tuple[Tracer, RecordWriter, MemorySampler]:
    writer = RecordWriter(str(path), 0)
    sampler = MemorySampler(0.002)
    sampler.start()  # sampling in the background, as in a rank
    return Tracer(writer, sampler, 0, auto_steps=False), writer, sampler


def test_rank_0s_parameter_save_is_in_no_steps_peak_and_the_warm_up_step_after_it_is_as_its_neighbours(tmp_path):
    # GIVEN a built-in workload's loop on rank 0, 2 steps and a warm-up step (2 steps never settle),
    # whose parameters (4 x 32 MiB) are read as copies when saved, between step 1 and the warm-up step
    # (np.savez held all four and 16 MiB more: the warm-up step's peak was 144 MiB above step 1's)
    tracer, writer, sampler = _tracer(tmp_path / "rank-0.jsonl")
    parameters = [Parameter(f"w{i}:0", HELD // 4) for i in range(4)]
    ctx = loop.WorkloadContext(tracer=tracer, rank=0, size=1, steps=2, seed=1, preset="tiny", overrides={},
                               run_dir=str(tmp_path), check_params=False, max_warmup=1, agreement=Agreement(LocalTransport()))

    def train_step(step: int) -> float:
        time.sleep(0.02)  # some samples in every step
        return 0.0

    # WHEN it trains
    loop.train(ctx, variables=lambda: parameters, train_step=train_step, broadcast=None, items_per_step=1)
    sampler.stop()
    writer.close()
    records = _records(tmp_path / "rank-0.jsonl")
    steps = {r["step"]: r for r in records if r["type"] == "step"}
    saves = [r for r in records if r["type"] == "own_work" and r["what"] == "save parameters"]
    # THEN the save held its copy of one variable at a time (32 MiB), as its own record shows
    assert (tmp_path / "params.npz").is_file() and len(saves) == 1 and not saves[0]["within_step"]
    assert saves[0]["rss_before_bytes"] + 28 * MiB <= saves[0]["peak_rss_bytes"] < saves[0]["rss_before_bytes"] + 60 * MiB
    assert saves[0]["rss_after_bytes"] < saves[0]["rss_before_bytes"] + 4 * MiB  # and left nothing behind
    # AND the warm-up step after it is no higher than the steps before it, beyond noise
    assert steps[2]["warmup"] and set(steps) == {-1, 0, 1, 2}
    neighbours = max(steps[0]["peak_rss_bytes"], steps[1]["peak_rss_bytes"])
    assert steps[2]["peak_rss_bytes"] < neighbours + 16 * MiB
    assert steps[2]["sampled_peak_rss_bytes"] < neighbours + 16 * MiB


def test_own_work_inside_a_step_is_cut_out_of_the_steps_figures_and_recorded_apart(tmp_path):
    tracer, writer, sampler = _tracer(tmp_path / "rank-0.jsonl")
    base = read_rss()
    # GIVEN a step that allocates 32 MiB of its own, and inside it memdiag's own work holding 128 MiB
    tracer.begin_step(0)
    job = np.ones(32 * MiB // 4, dtype=np.float32)
    with tracer.own_work("verification copy"):
        copy = np.ones(HELD // 4, dtype=np.float32)
        time.sleep(0.05)
        del copy
    time.sleep(0.02)
    tracer.end_step(0)
    del job
    sampler.stop()
    writer.close()
    records = _records(tmp_path / "rank-0.jsonl")
    step = next(r for r in records if r["type"] == "step")
    mem = next(r for r in records if r["type"] == "mem" and r["step"] == 0)
    own = next(r for r in records if r["type"] == "own_work")
    # THEN the step's peak holds the job's 32 MiB and not the copy, nor do its samples
    assert base + 24 * MiB <= step["peak_rss_bytes"] < base + 32 * MiB + 48 * MiB
    assert step["sampled_peak_rss_bytes"] < base + 80 * MiB and max(mem["rss"]) < base + 80 * MiB
    assert not any(own["t_start"] < t < own["t_end"] for t in mem["times"])
    # AND the own work's record holds the copy
    assert own["within_step"] and own["step"] == 0 and own["what"] == "verification copy"
    assert own["peak_rss_bytes"] >= own["rss_before_bytes"] + HELD - 8 * MiB


def test_the_step_end_digest_runs_after_the_steps_figures_and_before_the_next_step(tmp_path):
    tracer, writer, sampler = _tracer(tmp_path / "rank-0.jsonl")
    held: list[np.ndarray] = []

    def digest(step: int) -> dict:
        held.append(np.ones(HELD // 4, dtype=np.float32))  # a copy of the parameters, as the digest reads them
        time.sleep(0.05)
        held.clear()
        return {"param_digest": f"d{step}"}

    tracer.on_step_end.append(digest)
    for step in range(2):
        tracer.begin_step(step)
        time.sleep(0.02)
        tracer.end_step(step)
    sampler.stop()
    writer.close()
    records = _records(tmp_path / "rank-0.jsonl")
    steps = [r for r in records if r["type"] == "step"]
    owns = [r for r in records if r["type"] == "own_work"]
    assert [s["param_digest"] for s in steps] == ["d0", "d1"]
    assert len(owns) == 2 and all(o["peak_rss_bytes"] >= o["rss_before_bytes"] + HELD - 8 * MiB for o in owns)
    # step 1 follows step 0's digest: its peak and samples are its own
    mem = next(r for r in records if r["type"] == "mem" and r["step"] == 1)
    assert steps[1]["sampled_peak_rss_bytes"] < owns[0]["rss_before_bytes"] + 16 * MiB
    assert max(mem["rss"]) < owns[0]["rss_before_bytes"] + 16 * MiB and min(mem["times"]) > owns[0]["t_end"]


def test_saved_parameters_read_back_with_numpy_as_np_savez_wrote_them(tmp_path):
    values = {"emb/kernel:0": np.arange(12, dtype=np.float32).reshape(3, 4), "step:0": np.array(7, dtype=np.int64),
              "mask:0": np.array([True, False]), "fortran:0": np.asfortranarray(np.arange(6.0).reshape(2, 3))}

    class Held:
        def __init__(self, value: np.ndarray) -> None:
            self.value = value

        def numpy(self) -> np.ndarray:
            return self.value

    loop.save_parameters(str(tmp_path / "params.npz"), [Held(v) for v in values.values()], list(values))
    with np.load(tmp_path / "params.npz") as data:
        assert data.files == [f"{i:04d}:{name}" for i, name in enumerate(values)]
        for key, (name, value) in zip(data.files, values.items()):
            assert data[key].dtype == value.dtype and np.array_equal(data[key], value), name
    assert not (tmp_path / "params.npz.tmp").exists()
