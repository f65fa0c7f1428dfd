"""Run one of Horovod's unmodified example scripts on CPU with a capped step count.

Usage (one process per rank)::

    mpirun -np 2 python tests/conformance/launch.py SCRIPT [script args...]

The script runs with ``runpy`` as ``__main__`` with ``sys.argv == [SCRIPT, *args]``. Its file is never
read or rewritten; what this wrapper changes is only the process around it:

Data (no download ever happens):
  * MNIST: ``keras.datasets.mnist.load_data(path)`` calls ``get_file`` with the hash of the real MNIST
    file, so a local copy that is not real MNIST would be "re-downloaded". The ``get_file`` name that
    Keras's mnist module looks up is replaced by one that returns a small synthetic MNIST-shaped npz
    (uint8 images [n, 28, 28], uint8 labels, seeded) for any ``path`` the script asks for.
  * word2vec: ``text8-<rank>.zip`` is put in the run directory as a symlink to a synthetic zip whose first
    member is a seeded Zipf-distributed corpus (every one of 60000 word forms at least once, so the
    script's 50000-word dictionary is full) and whose second, stored member pads the archive to the
    31344016 bytes the script checks.
  Both are generated once into CONFORMANCE_DATA_DIR (default ``$TMPDIR/memdiag-conformance/data``).

Environment of the process:
  * cwd is the run directory: CONFORMANCE_WORKDIR, else ``$TMPDIR/memdiag-conformance/runs/<job>`` with
    <job> the MPI job id that all ranks share (PMIX_NAMESPACE), so checkpoints a script writes to ``./``
    never leak into the next run (a restored global step on rank 0 only would desynchronise the ranks).
  * HOME is set to ``<run dir>/home`` (with ``.keras/`` in it, as Keras's first import would make), so
    neither the scripts' ``os.mkdir(~/.keras/datasets)`` nor Keras's ``~/.keras/keras.json`` touch the
    user's home. (Keras 2.15's ``get_file`` ignores KERAS_HOME.)

TF1 shim (only for the scripts in ``SCRIPTS`` that need it, or with ``--tf1 MODE`` before SCRIPT):
  Horovod (and tf.keras, tf.estimator) are imported first against the real ``tensorflow``; then
  ``sys.modules['tensorflow']`` becomes ``tensorflow.compat.v1`` so the script's ``import tensorflow as
  tf`` sees the TF1 names (tf.placeholder, tf.Session, tf.ConfigProto, tf.train.*Optimizer, ...).
  ``graph`` also calls ``disable_v2_behavior()``; ``eager`` keeps TF2 behaviour (for scripts that only use
  TF1 names, e.g. ``tf.enable_eager_execution``). ``keras_v1`` also maps the standalone ``keras`` module to
  ``tensorflow.compat.v1.keras`` (for ``K.set_session``), before ``horovod.keras`` is imported.

Step caps (K = CONFORMANCE_STEPS, default 5), by patching the loop drivers, never the model:
  * ``StopAtStepHook(num_steps, last_step)`` -> each min(., K).
  * ``Estimator.train(steps, max_steps)`` -> min(., K) (steps=K when both are None).
  * keras ``Model.fit``/``fit_generator``: epochs -> 1, steps_per_epoch and validation_steps -> min(., K),
    plus a callback that sets ``model.stop_training`` after K batches (for arrays without steps_per_epoch).
  * ``tf.data.Dataset.take(n)`` -> take(min(n, K)) for a Python int n >= 0 (only for scripts whose loop
    is ``for ... in dataset.take(n)``).
  * TF1 ``Session.run``: runs whose fetches include an op returned by an optimizer's ``apply_gradients``
    or ``minimize`` are counted; after the K-th the script is ended by a private BaseException that this
    wrapper catches, prints ``conformance: stopped after K steps`` and exits 0. Every rank counts the same
    collective-bearing runs, so all stop after the same step with no collective left pending.
  The synthetic benchmarks are capped with their own command-line flags, not by a patch.

Never changed: the script's file, its model, optimizer, loss, batch size, learning rate, Horovod calls,
gradient handling, and the arguments given on the command line.
"""

from __future__ import annotations

import inspect
import os
import runpy
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEXT8_BYTES = 31344016  # the size tensorflow_word2vec.py's maybe_download() insists on


@dataclass(frozen=True)
class Spec:
    tf1: str | None = None  # None, "graph" or "eager"
    keras_v1: bool = False
    caps: tuple[str, ...] = ("stop_at_step", "estimator", "fit")
    text8: bool = False


SCRIPTS: dict[str, Spec] = {
    "tensorflow_word2vec.py": Spec(tf1="graph", caps=("session_run",), text8=True),
    "tensorflow_mnist.py": Spec(tf1="graph", caps=("stop_at_step",)),
    "tensorflow_mnist_estimator.py": Spec(tf1="graph", caps=("estimator",)),
    "tensorflow_mnist_eager.py": Spec(tf1="eager", caps=("take",)),
    "tensorflow_keras_mnist.py": Spec(tf1="eager", caps=("fit",)),
    "tensorflow_synthetic_benchmark.py": Spec(tf1="graph", caps=()),
    "tensorflow2_mnist.py": Spec(caps=("take",)),
    "tensorflow2_keras_mnist.py": Spec(caps=("fit",)),
    "tensorflow2_synthetic_benchmark.py": Spec(caps=()),
    "tensorflow2_keras_synthetic_benchmark.py": Spec(caps=()),
    "keras_mnist.py": Spec(tf1="eager", keras_v1=True, caps=("fit",)),
    "keras_mnist_advanced.py": Spec(tf1="eager", keras_v1=True, caps=("fit",)),
}


class _StepCapReached(BaseException):
    """Raised from Session.run after the K-th training step; caught only by main()."""


def _env_rank() -> str:
    for key in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "HOROVOD_RANK"):
        if os.environ.get(key):
            return os.environ[key]
    return "0"


def _run_dir(base: Path) -> Path:
    explicit = os.environ.get("CONFORMANCE_WORKDIR")
    if explicit:
        return Path(explicit).resolve()
    job = os.environ.get("PMIX_NAMESPACE") or os.environ.get("SLURM_JOB_ID") or f"pid{os.getpid()}"
    return base / "runs" / job


def _atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        write(tmp)
        os.replace(tmp, path)  # ranks write identical bytes; the last replace wins
    return path


def synthetic_mnist(data_dir: Path, n_train: int = 2048, n_test: int = 512) -> Path:
    """A seeded MNIST-shaped npz: one noisy template per class, uint8 like the real file."""

    def write(tmp: Path) -> None:
        import numpy as np

        rng = np.random.default_rng(2017)
        templates = rng.integers(0, 256, size=(10, 28, 28))

        def split(n: int) -> tuple[Any, Any]:
            y = rng.integers(0, 10, size=n).astype(np.uint8)
            x = np.clip(templates[y] + rng.normal(0, 48, size=(n, 28, 28)), 0, 255).astype(np.uint8)
            return x, y

        (x_train, y_train), (x_test, y_test) = split(n_train), split(n_test)
        with open(tmp, "wb") as f:
            np.savez(f, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)

    return _atomic_write(data_dir / "mnist-synthetic.npz", write)


def synthetic_text8(data_dir: Path, n_words: int = 200_000, n_forms: int = 60_000) -> Path:
    """A zip of exactly TEXT8_BYTES whose first member is a seeded Zipf corpus."""

    def write(tmp: Path) -> None:
        import numpy as np

        rng = np.random.default_rng(2015)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        forms = ["".join(letters[rng.integers(0, 26, size=3 + i % 6)]) + f"{i:x}" for i in range(n_forms)]
        p = 1.0 / np.arange(1, n_forms + 1)
        words = rng.choice(n_forms, size=n_words, p=p / p.sum()).tolist() + rng.permutation(n_forms).tolist()
        corpus = " ".join(forms[i] for i in words).encode()
        stamp = (2017, 1, 1, 0, 0, 0)

        def build(pad: int) -> None:
            with zipfile.ZipFile(tmp, "w") as z:
                z.writestr(zipfile.ZipInfo("text8", stamp), corpus, compress_type=zipfile.ZIP_DEFLATED)
                padding = np.random.default_rng(0).bytes(pad)
                z.writestr(zipfile.ZipInfo("padding", stamp), padding, compress_type=zipfile.ZIP_STORED)

        build(0)  # stored member: the archive grows byte for byte with the padding
        build(TEXT8_BYTES - tmp.stat().st_size)
        assert tmp.stat().st_size == TEXT8_BYTES, tmp.stat().st_size

    return _atomic_write(data_dir / "text8-synthetic.zip", write)


def _patch_mnist(data_dir: Path) -> None:
    import keras.src.datasets.mnist as mnist_module

    def local_get_file(fname: str | None = None, origin: str | None = None, **_: Any) -> str:
        return str(synthetic_mnist(data_dir))

    mnist_module.get_file = local_get_file


def _patch_caps(caps: tuple[str, ...], k: int) -> None:
    def cap(n: Any) -> Any:
        return min(n, k) if isinstance(n, int) and n >= 0 else n

    if "stop_at_step" in caps:
        from tensorflow.python.training.basic_session_run_hooks import StopAtStepHook

        hook_init = StopAtStepHook.__init__

        def hook_init_capped(self: Any, num_steps: Any = None, last_step: Any = None) -> None:
            hook_init(self, num_steps=cap(num_steps), last_step=cap(last_step))

        StopAtStepHook.__init__ = hook_init_capped

    if "estimator" in caps:
        from tensorflow_estimator.python.estimator.estimator import Estimator

        train = Estimator.train

        def train_capped(self: Any, input_fn: Any, hooks: Any = None, steps: Any = None, max_steps: Any = None,
                         saving_listeners: Any = None) -> Any:
            steps = k if steps is None and max_steps is None else cap(steps)
            return train(self, input_fn, hooks=hooks, steps=steps, max_steps=cap(max_steps),
                         saving_listeners=saving_listeners)

        Estimator.train = train_capped

    if "fit" in caps:
        import tensorflow as tf
        from keras.src.engine import training, training_v1

        class StopAfter(tf.keras.callbacks.Callback):  # type: ignore[misc]
            def __init__(self) -> None:
                super().__init__()
                self.batches = 0

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                self.batches += 1
                if self.batches >= k:
                    self.model.stop_training = True

        def capped(method: Callable[..., Any]) -> Callable[..., Any]:
            signature = inspect.signature(method)

            def fit(*args: Any, **kwargs: Any) -> Any:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                call = bound.arguments
                call.update(epochs=1, initial_epoch=0, callbacks=list(call["callbacks"] or []) + [StopAfter()])
                for key in ("steps_per_epoch", "validation_steps"):
                    call[key] = cap(call[key])
                return method(*bound.args, **bound.kwargs)

            return fit

        for cls in (training.Model, training_v1.Model):
            for name in ("fit", "fit_generator"):
                if name in vars(cls):
                    setattr(cls, name, capped(vars(cls)[name]))

    if "take" in caps:
        from tensorflow.python.data.ops.dataset_ops import DatasetV2

        take = DatasetV2.take

        def take_capped(self: Any, count: Any, name: Any = None) -> Any:
            return take(self, cap(count), name=name)

        DatasetV2.take = take_capped

    if "session_run" in caps:
        from tensorflow.python.client.session import BaseSession
        from tensorflow.python.training.optimizer import Optimizer
        from tensorflow.python.util import nest

        train_ops: set = set()  # type: ignore[type-arg]
        done = [0]

        def recording(method: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                op = method(self, *args, **kwargs)
                train_ops.add(op)
                return op

            return wrapper

        Optimizer.apply_gradients = recording(Optimizer.apply_gradients)
        Optimizer.minimize = recording(Optimizer.minimize)
        run = BaseSession.run

        def run_counted(self: Any, fetches: Any, *args: Any, **kwargs: Any) -> Any:
            result = run(self, fetches, *args, **kwargs)
            if any(f in train_ops for f in nest.flatten(fetches) if f is not None):
                done[0] += 1
                if done[0] >= k:
                    raise _StepCapReached
            return result

        BaseSession.run = run_counted


def _swap_to_tf1(mode: str, keras_v1: bool) -> None:
    import horovod.tensorflow  # noqa: F401  (binds the real tensorflow)
    import horovod.tensorflow.keras  # noqa: F401
    import tensorflow as tf

    v1 = tf.compat.v1
    for name in ("keras", "layers", "estimator", "losses", "train", "nn"):
        getattr(v1, name)  # resolve lazy modules while the real tensorflow is in sys.modules
    if keras_v1:
        import keras.api._v1.keras as keras_v1_api  # what v1.keras lazily loads; not the loader itself

        sys.modules["keras"] = keras_v1_api
        import horovod.keras  # noqa: F401  (its backend K must have get_session)
    if mode == "graph":
        v1.disable_v2_behavior()
    sys.modules["tensorflow"] = v1


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    tf1_flag: str | None = None
    if args[:1] == ["--tf1"] and len(args) > 1 and args[1] in ("graph", "eager"):
        tf1_flag, args = args[1], args[2:]
    if not args or args[0].startswith("--"):
        print(__doc__)
        return 2
    script = Path(args[0]).resolve()
    spec = SCRIPTS.get(script.name, Spec())
    k = int(os.environ.get("CONFORMANCE_STEPS", "5"))

    base = Path(tempfile.gettempdir()) / "memdiag-conformance"
    data_dir = Path(os.environ.get("CONFORMANCE_DATA_DIR") or base / "data").resolve()
    run_dir = _run_dir(base)
    (run_dir / "home" / ".keras").mkdir(parents=True, exist_ok=True)  # as a first Keras import makes it
    os.environ["HOME"] = str(run_dir / "home")
    os.chdir(run_dir)
    if spec.text8:
        link = run_dir / (f"text8-{_env_rank()}.zip")
        if not link.exists():
            link.symlink_to(synthetic_text8(data_dir))

    _patch_mnist(data_dir)
    _patch_caps(spec.caps, k)
    mode = tf1_flag or spec.tf1
    if mode:
        _swap_to_tf1(mode, spec.keras_v1)

    sys.argv = [str(script)] + args[1:]
    sys.path[0] = str(script.parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except _StepCapReached:
        print(f"conformance: stopped after {k} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
