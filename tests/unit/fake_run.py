"""Run directories written by memdiag's own record writer, without MPI: inputs for unit tests."""

from __future__ import annotations

import json
from pathlib import Path

from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.format.writer import RecordWriter


def meta(op: str, name: str, part=None, sparse=False, densified=False, itemsize=4, dtype="float32") -> dict:
    return {"op": op, "name": name, "part": part, "dtype": dtype, "itemsize": itemsize,
            "sparse": sparse, "densified": densified}


def make_run(path: Path, world_size: int = 2, steps: int = 3, rows: int = 256, width: int = 32,
             vocab: int = 512, mode: str = "sparse", kill_rank_after: int | None = None, items: bool = True) -> Path:
    """A run of a model with one embedding (IndexedSlices) and one dense kernel; ``items=False``: its
    steps say nothing of the examples they hold, as a script's do not."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"workload": "transformer", "preset": "tiny", "mode": mode,
                                               "world_size": world_size, "steps": steps, "status": "ok"}))
    for rank in range(world_size):
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        tracer = Tracer(writer, MemorySampler(), rank, auto_steps=False)
        writer.write_now({"type": "start", "size": world_size, "host": "h", "versions": {"tensorflow": "2.15.1"}})
        for step in range(steps):
            if kill_rank_after is not None and rank == 1 and step > kill_rank_after:
                break  # this rank "died": no end record
            tracer.begin_step(step)
            if mode == "sparse":
                tracer.collective(meta("allgather", "m/emb:0", "values", sparse=True),
                                  [rows, width], [world_size * rows, width])
                tracer.collective(meta("allgather", "m/emb:0", "indices", sparse=True, dtype="int32"),
                                  [rows], [world_size * rows])
            else:
                tracer.collective(meta("allreduce", "m/emb:0", sparse=True, densified=True),
                                  [vocab, width], [vocab, width])
            tracer.collective(meta("allreduce", "m/kernel:0"), [width, width], [width, width])
            tracer.end_step(step, loss=5.0 - step, param_digest=f"d{step}", **({"items": rows} if items else {}))
        else:
            writer.write_now({"type": "end", "status": "ok", "error": None, "hwm_bytes": 1})
        writer.close()
    return path
