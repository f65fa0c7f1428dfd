"""The training loop shared by the built-in workloads: ordinary Horovod TF2 code plus step marks."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from memdiag import rundir


@dataclass
class WorkloadContext:
    """What the agent hands a built-in workload."""

    tracer: Any
    rank: int
    size: int
    steps: int
    seed: int
    preset: str
    overrides: dict[str, str]
    run_dir: str | None  # where rank 0 saves the final parameters (None: not visible)
    check_params: bool


def parameter_digest(variables: list) -> str:
    """Exact fingerprint of all parameters: equal on every rank iff the parameters are identical."""
    digest = hashlib.blake2b(digest_size=16)
    for var in variables:
        digest.update(np.ascontiguousarray(var.numpy()).tobytes())
    return digest.hexdigest()


def train(
    ctx: WorkloadContext,
    variables: Callable[[], list],
    train_step: Callable[[int], Any],
    broadcast: Callable[[], None],
    items_per_step: int,
) -> None:
    """Broadcast from rank 0, then ``ctx.steps`` steps; each step flushed with loss and digest."""
    import horovod.tensorflow as hvd  # noqa: F401  (initialised by the agent)

    tracer = ctx.tracer
    tracer.begin_step(-1)
    broadcast()
    tracer.end_step(-1)
    if ctx.check_params:
        # Measured after the step's memory figures are taken, so its copies never count.
        tracer.on_step_end.append(lambda step: {"param_digest": parameter_digest(variables())} if step >= 0 else None)
    for step in range(ctx.steps):
        tracer.begin_step(step)
        loss = float(train_step(step))
        tracer.end_step(step, loss=loss, items=items_per_step)
    if ctx.rank == 0 and ctx.run_dir is not None:
        save_parameters(os.path.join(ctx.run_dir, rundir.PARAMETERS), variables())


def save_parameters(path: str, variables: list) -> None:
    arrays = {f"{i:04d}:{var.name}": var.numpy() for i, var in enumerate(variables)}
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
