"""The training loop shared by the built-in workloads: ordinary TF2 code plus step marks.

The loop itself uses no engine: the workload passes its own step (Horovod's, or
tf.distribute.MultiWorkerMirroredStrategy's) and initial broadcast, and the context carries the
agreement between ranks (:attr:`WorkloadContext.agreement`). Whatever a rank decides that changes the
step count is agreed, so that every rank runs the same steps and issues the same collectives.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memdiag.agentconfig import HOROVOD
from memdiag.agreement import Agreement
from memdiag.compat import paired
from memdiag.format import rundir
from memdiag.format.records import SETUP_STEP


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
    max_warmup: int = 0  # extra steps allowed while the per-step peak has not settled
    # auto on several ranks: decide for embedding tables from their first batch's ids before the step
    # is traced, [(variable, ids)] (every rank, the same tables in the same order)
    decide_lookups: Callable[[list[tuple[Any, Any]]], None] | None = None
    engine: str = HOROVOD  # what reduces the gradients (memdiag.agentconfig.ENGINES)
    # The ranks' agreement (memdiag.agreement); None: Horovod's, on its global process set. The
    # tf-distribute engine passes MPI's.
    agreement: Agreement | None = None


def value_view(var: Any) -> np.ndarray[Any, Any]:
    """A variable's value now, as a NumPy view of the tensor a read of it returns: on the CPU that tensor
    shares the variable's buffer, so nothing is copied (``var.numpy()`` copies the whole value, and the
    freed copies stayed resident in the rank). The view is a snapshot: a later update of the variable
    writes to a buffer of its own while the view is alive. Anything without ``read_value`` (a Keras 3
    variable, a stand-in) is read by its ``numpy()``."""
    read = getattr(var, "read_value", None)
    return np.asarray(read() if callable(read) else var.numpy())


def parameter_digest(variables: list[Any]) -> str:
    """Exact fingerprint of all parameters: equal on every rank iff the parameters are identical. Each is
    hashed from a view of its value (:func:`value_view`), one at a time."""
    digest = hashlib.blake2b(digest_size=16)
    for var in variables:
        digest.update(np.ascontiguousarray(value_view(var)).data)  # the view's bytes, without a copy
    return digest.hexdigest()


def train(
    ctx: WorkloadContext,
    variables: Callable[[], list[Any]],
    train_step: Callable[[int], Any],
    broadcast: Callable[[], None] | None,
    items_per_step: int,
) -> None:
    """The set-up step -1 (the broadcast from rank 0; ``None``: MultiWorkerMirroredStrategy broadcast
    worker 0's initial values when it created the variables), then ``ctx.steps`` steps; each step
    flushed with loss and digest.

    Then, while the per-step peak of any rank has not settled (memdiag.analyze.steady's rule), up to
    ``ctx.max_warmup`` more steps: every rank takes part in the decision (one agreement), so all
    run the same steps. The parameters compared between modes are saved after ``ctx.steps`` steps,
    whatever the warm-up added."""
    tracer = ctx.tracer
    tracer.begin_step(SETUP_STEP)
    if broadcast is not None:
        broadcast()
    tracer.end_step(SETUP_STEP)
    if ctx.check_params:
        # Measured after the step's memory figures are taken, so its copies never count.
        tracer.on_step_end.append(lambda step: {"param_digest": parameter_digest(variables())} if step >= 0 else None)
    for step in range(ctx.steps):
        tracer.begin_step(step)
        loss = float(train_step(step))
        tracer.end_step(step, loss=loss, items=items_per_step)
    if ctx.rank == 0 and ctx.run_dir is not None:
        # Between steps, so in no step's figures (a warm-up step follows); its own peak is recorded.
        with tracer.own_work("save parameters"):
            save_parameters(os.path.join(ctx.run_dir, rundir.PARAMETERS), variables())
    step = ctx.steps
    while step < ctx.steps + ctx.max_warmup and not _all_settled(tracer.step_peaks, step, ctx.agreement):
        tracer.begin_step(step)
        loss = float(train_step(step))
        tracer.end_step(step, loss=loss, items=items_per_step, warmup=True)
        step += 1


def _all_settled(peaks: list[int], step: int, agreement: Agreement | None) -> bool:
    """Whether every rank's per-step peak has settled (memdiag.analyze.steady's rule, the one the
    steady figures use): the largest "not yet" of any rank, agreed before warm-up step ``step``
    (memdiag's own exchange, never recorded as the job's, and between steps, so in no step's figures),
    so that every rank runs the same steps."""
    from memdiag.analyze.steady import steady_start

    not_yet = 0 if steady_start(peaks)[1] else 1
    if agreement is None:
        from memdiag.agreement import for_horovod

        agreement = for_horovod()
    return agreement.max(f"warmup/{step}", (not_yet,)) == (0,)


def variable_name(var: Any) -> str:
    """A variable's name, unique in its model: TensorFlow's (under Keras 2, its layers' path and ":0").
    A Keras 3 variable's own name is its last part only ("kernel", and TensorFlow's "transformer/kernel:0"
    repeats too), so it is named by its path, in Keras 2's form."""
    path = getattr(var, "path", None)  # Keras 3's; TensorFlow's variables have none
    return f"{path}:0" if isinstance(path, str) else var.name


def save_parameters(path: str, variables: list[Any], names: list[str] | None = None) -> None:
    """``variables`` to ``path`` as "INDEX:NAME" arrays of an .npz archive (what np.savez writes and
    np.load reads), named by :func:`variable_name` unless ``names`` says otherwise; one variable read at a
    time (:func:`save_arrays`), from a view of its value (:func:`value_view`)."""
    names = [variable_name(var) for var in variables] if names is None else names
    save_arrays(path, ((name, value_view(var)) for name, var in paired(names, variables)))


def save_arrays(path: str, arrays: Iterable[tuple[str, Any]], empty: bool = True) -> int:
    """``arrays`` ((name, value) pairs, taken one at a time) to ``path`` as "INDEX:NAME" arrays of an .npz
    archive; returns how many. ``empty``: write an archive of none where there are none (else no file).

    Each value is written from its own buffer and let go before the next is taken, so with values read
    as they are reached (a generator), the save holds one variable's value (a view of it, from
    :func:`value_view`, copies nothing) and no buffers of its own: np.savez holds every array at once and
    copies each through 16 MiB chunks, which glibc keeps (that way the save peaked above all the arrays
    together and RSS stayed a chunk higher; this way it stays where it began; measured:
    docs/notes/memory.md#memdiags-own-work-inside-a-step)."""
    tmp = path + ".tmp"
    archive: zipfile.ZipFile | None = None
    count = 0
    try:
        for name, value in arrays:
            array = np.asarray(value, order="C")  # (ascontiguousarray makes a scalar 1-d)
            if archive is None:
                archive = zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True)
            with archive.open(f"{count:04d}:{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array_header_1_0(  # type: ignore[no-untyped-call]
                    member, np.lib.format.header_data_from_array_1_0(array))  # type: ignore[no-untyped-call]
                member.write(array.reshape(-1).view(np.uint8).data)
            count += 1
            del array, value  # before the next is taken
        if archive is None and empty:
            archive = zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True)
    finally:
        if archive is not None:
            archive.close()
    if archive is not None:
        os.replace(tmp, path)
    return count
