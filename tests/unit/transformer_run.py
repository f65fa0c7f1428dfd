"""Run directories shaped like the built-in Transformer's, written by memdiag's own record writer and
policy (no MPI): long tensor names, the reference sizes (5000 rows per rank, width 1024, vocab 33945)
and any rank count, so that reports can be drawn from what real runs produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from memdiag.agent.sampler import MemorySampler
from memdiag.agent.tracer import Tracer
from memdiag.analyze.summary import summarize
from memdiag.format.reader import load_run
from memdiag.format.writer import RecordWriter
from memdiag.formula import SparseGradientShape
from memdiag.policy import decide
from tests.unit.fake_run import meta

SOURCE = "transformer/encoder/source_embedding/embeddings:0"
TARGET = "transformer/decoder/target_embedding/embeddings:0"
KERNEL = "transformer/decoder/layer_5/ffn/output_dense/kernel:0"
ROWS, WIDTH, VOCAB = 5000, 1024, 33945


def shape(rows: int = ROWS) -> SparseGradientShape:
    return SparseGradientShape(rows_per_rank=rows, row_bytes=WIDTH * 4, index_bytes=4, dense_rows=VOCAB,
                               row_elements=WIDTH)


def make_transformer_run(path: Path, world_size: int, mode: str = "sparse", steps: int = 2,
                         rows: dict[str, int] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """A run of two embedding tables (IndexedSlices gradients) and one dense kernel; ``rows`` per
    table (default 5000 each). Writes summary.json as ``memdiag run`` does, with ``extra`` fields
    merged in (the fields a newer summary carries)."""
    rows = rows or {SOURCE: ROWS, TARGET: ROWS}
    path.mkdir(parents=True, exist_ok=True)
    (path / "run.json").write_text(json.dumps({"workload": "transformer", "preset": "base", "mode": mode,
                                               "world_size": world_size, "steps": steps, "status": "ok"}))
    decisions = {name: decide(mode, name, world_size, shape(n)) for name, n in rows.items()}
    for rank in range(world_size):
        writer = RecordWriter(str(path / f"rank-{rank}.jsonl"), rank)
        tracer = Tracer(writer, MemorySampler(), rank, auto_steps=False)
        writer.write_now({"type": "start", "size": world_size, "host": "h", "versions": {"tensorflow": "2.15.1"}})
        for decision in decisions.values():
            writer.add(decision.as_record())
        for step in range(steps):
            tracer.begin_step(step)
            if world_size > 1:  # one rank runs no collective
                for name, n in rows.items():
                    if decisions[name].densify:
                        tracer.collective(meta("allreduce", name, sparse=True, densified=True),
                                          [VOCAB, WIDTH], [VOCAB, WIDTH])
                    else:
                        tracer.collective(meta("allgather", name, "values", sparse=True),
                                          [n, WIDTH], [world_size * n, WIDTH])
                        tracer.collective(meta("allgather", name, "indices", sparse=True, dtype="int32"),
                                          [n], [world_size * n])
                tracer.collective(meta("allreduce", KERNEL), [4 * WIDTH, WIDTH], [4 * WIDTH, WIDTH])
            tracer.end_step(step, loss=5.0 - step, items=sum(rows.values()), param_digest=f"d{step}")
        writer.write_now({"type": "end", "status": "ok", "error": None, "hwm_bytes": 1})
        writer.close()
    # Final parameters, as rank 0 of a built-in workload saves them: the same in every mode.
    np.savez(path / "params.npz", **{"0:" + KERNEL: np.linspace(0, 1, 16, dtype=np.float32)})
    summary = {**summarize(load_run(str(path))), **(extra or {})}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def load_summary(path: Path) -> dict[str, Any]:
    return json.loads((path / "summary.json").read_text())
