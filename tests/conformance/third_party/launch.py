"""Run one of the vendored third-party Horovod scripts unchanged, on CPU, with a capped step count.

Usage (one process per rank)::

    mpirun -np 2 python tests/conformance/third_party/launch.py SCRIPT [script args...]

The scripts are not Horovod's own: they come from other projects' repositories (see each folder's
SOURCES.md) and all have embedding tables, whose gradients TensorFlow hands to Horovod as
``tf.IndexedSlices`` (but in ``horovod_criteo_deepctr.py``, whose own regulariser makes them dense). As
``tests/conformance/launch.py`` does for Horovod's examples (whose helpers this wrapper uses: run directory,
HOME, step caps, TF1 names), only the process around the script changes; the script's file is never read or
rewritten and runs with ``runpy`` as ``__main__``.

What each script gets (``SCRIPTS`` below):

* ``sentiment-distributed.py.txt`` (amazon-sagemaker-examples' ``sentiment-distributed.py``; Keras ``fit``):
    - Data where SageMaker puts it: ``SM_CHANNEL_TRAIN`` and ``SM_CHANNEL_TEST`` name a folder with the
      four arrays the notebook saves (``x_train.npy`` ... ``y_test.npy``): a seeded, Zipf-distributed
      stand-in for IMDB padded to 400 tokens, ids below 20000 (int32), int64 labels all 0 (the comment
      on SYNTHETIC_IMDB_LABELS says why), 512 training and 32 test reviews. ``SM_MODEL_DIR`` is
      ``<run dir>/model-<rank>`` (on SageMaker each host has its own; here both ranks share a disk, so
      each gets a folder). Each is set only when not already set.
    - ``hvd.callbacks.LearningRateWarmupCallback(warmup_epochs=3, verbose=1)`` is called without
      ``initial_lr``, as Horovod before 0.21 allowed (the learning rate was read from the model's
      optimizer when training began); Horovod 0.28.1 raises ``TypeError`` for the missing argument. The
      callback's ``__init__`` is wrapped so that a missing ``initial_lr`` means that old behaviour again
      (0.28.1 still reads the optimizer's rate in ``on_train_begin`` when ``initial_lr`` is None).
    - Step cap: Keras ``fit`` (tests/conformance/launch.py's ``fit`` cap: one epoch of at most K batches).
* ``tf_horovod_word2vec.py`` (Azure/MachineLearningNotebooks; TF1 graph and ``Session``):
    - ``azureml.core.run`` from ``stubs/`` beside this file (``Run.get_context().log`` prints), put on
      ``sys.path`` for this script only.
    - The corpus its ``--input_data`` names: ``text8.zip`` in the run directory, a link to the synthetic
      text8 zip of tests/conformance/launch.py (its first member is what the script reads).
    - TF1 names (``import tensorflow`` gives ``tensorflow.compat.v1`` after ``disable_v2_behavior()``), and
      the step cap by counting the session's training runs.

* ``horovod_criteo_deepctr.py`` (4paradigm/OpenEmbedding; Keras ``fit`` on a DeepFM from ``deepctr``):
    - The file its ``--data`` names: ``train.csv`` in the run directory, a link to a seeded stand-in for
      the Criteo CSV that OpenEmbedding's ``examples/criteo_preprocess.py`` writes (``to_csv`` with its
      unnamed index column, ``label``, ``I1``..``I13`` scaled to [0, 1], ``C1``..``C26`` label-encoded
      integers), CRITEO_ROWS rows with Zipf-distributed categories of CRITEO_CARDINALITIES. The script
      sizes each ``C`` table from the data (largest id + 1).
    - Step cap: Keras ``fit`` (tests/conformance/launch.py's ``fit`` cap: one epoch of at most K batches,
      where the script asks for 3 epochs). Its SavedModel goes where ``--save`` says, in the run directory.
    - ``deepctr`` and ``pandas``, installed by the ``test`` extra of pyproject.toml.

K is CONFORMANCE_STEPS (default 5). The run directory, data directory and HOME are those of
tests/conformance/launch.py (CONFORMANCE_WORKDIR, CONFORMANCE_DATA_DIR).

Never changed: the script's file, its model, optimizer, loss, batch size, learning rate, Horovod calls,
gradient handling, and the arguments given on the command line.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import runpy
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STUBS = HERE / "stubs"


def _load_base() -> Any:
    """tests/conformance/launch.py, loaded by path: this file has the same name, so ``import launch``
    from here would find itself."""
    spec = importlib.util.spec_from_file_location("conformance_launch", HERE.parent / "launch.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


base = _load_base()

IMDB_TOKENS = 400  # maxlen of the notebook and the script
IMDB_WORDS = 20000  # max_features of both
# The script's loss is SparseCategoricalCrossentropy on a model with ONE sigmoid output: the only class
# index it can take is 0. TensorFlow on CPU rejects IMDB's label 1 ("Received a label value of 1 which is
# outside the valid range of [0, 1)"); on the GPUs the notebook trained on, the op does not check it. With
# every label 0 the script runs as written; its loss is then 0 and its gradients are zeros, but they are
# computed and reduced as with any labels: the embedding's gradient is still an IndexedSlices of the
# batch's 8 x 400 token rows.
SYNTHETIC_IMDB_LABELS = 0

CRITEO_ROWS = 4096  # 2048 a rank: with --batch_size 512, 4 batches, more than the tests' 3 steps
CRITEO_DENSE = 13  # I1..I13
# C1..C26: the number of values each categorical column draws from (ids 0..n-1, as LabelEncoder numbers
# them). Criteo's own range from 3 to millions; these keep the ranges' shape (a few tiny, a few wide) at a
# size where the tables stay small: about 24700 rows in all, 64 + 1 floats a row (the script's two tables
# of each column), 6 MiB.
CRITEO_CARDINALITIES = (1460, 580, 2000, 1800, 300, 24, 1500, 630, 3, 1900, 1200, 2000, 1100, 27, 1700, 2000,
                        10, 900, 400, 4, 2000, 18, 15, 1600, 105, 1400)


@dataclass(frozen=True)
class Spec:
    tf1: str | None = None  # None or "graph" (tests/conformance/launch.py's TF1 swap)
    caps: tuple[str, ...] = ()
    text8_link: str | None = None  # a link to the synthetic text8 zip, by this name, in the run directory
    sagemaker_imdb: bool = False  # SM_CHANNEL_TRAIN/TEST with the synthetic IMDB arrays, SM_MODEL_DIR
    stubs: bool = False  # stubs/ on sys.path
    criteo_link: str | None = None  # a link to the synthetic Criteo CSV, by this name, in the run directory
    warmup_without_initial_lr: bool = False


SCRIPTS: dict[str, Spec] = {
    "sentiment-distributed.py.txt": Spec(caps=("fit",), sagemaker_imdb=True, warmup_without_initial_lr=True),
    "tf_horovod_word2vec.py": Spec(tf1="graph", caps=("session_run",), text8_link="text8.zip", stubs=True),
    "horovod_criteo_deepctr.py": Spec(caps=("fit",), criteo_link="train.csv"),
}


def synthetic_imdb(data_dir: Path, n_train: int = 512, n_test: int = 32) -> Path:
    """A folder with x_train.npy, y_train.npy, x_test.npy, y_test.npy shaped as the notebook saves the
    padded IMDB reviews: int32 [n, 400] word ids (0 = padding, left-padded as pad_sequences does), int64
    labels, all 0 (SYNTHETIC_IMDB_LABELS). Seeded; Zipf-distributed ids, so a batch repeats its frequent
    words as text does."""
    folder = data_dir / "imdb-synthetic"

    def write(tmp: Path) -> None:
        import numpy as np

        rng = np.random.default_rng(2020)
        p = 1.0 / np.arange(1, IMDB_WORDS)
        p /= p.sum()

        def split(n: int) -> tuple[Any, Any]:
            x = np.zeros((n, IMDB_TOKENS), dtype=np.int32)
            lengths = rng.integers(20, IMDB_TOKENS + 1, size=n)
            for row, length in enumerate(lengths):
                x[row, IMDB_TOKENS - length:] = 1 + rng.choice(IMDB_WORDS - 1, size=length, p=p)
            return x, np.zeros(n, dtype=np.int64)  # class 0 only: see SYNTHETIC_IMDB_LABELS

        tmp.mkdir(parents=True)
        for name, (x, y) in (("train", split(n_train)), ("test", split(n_test))):
            np.save(tmp / f"x_{name}.npy", x)
            np.save(tmp / f"y_{name}.npy", y)

    if not folder.exists():
        tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
        write(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:  # the other rank's folder is in place (same bytes): keep it
            shutil.rmtree(tmp)
    return folder


def synthetic_criteo(data_dir: Path, n_rows: int = CRITEO_ROWS) -> Path:
    """A CSV laid out as OpenEmbedding's ``examples/criteo_preprocess.py`` writes Criteo's training data
    (``DataFrame.to_csv(path, float_format="%.6f")``): an unnamed index column, ``label`` (0 or 1, a quarter
    1 as in Criteo), ``I1``..``I13`` in [0, 1] (its MinMaxScaler's range), ``C1``..``C26`` integer ids below
    CRITEO_CARDINALITIES (its LabelEncoder's ids). Seeded; each column's ids Zipf-distributed over a
    shuffled order, so a batch repeats the frequent ones as click logs do."""
    path = data_dir / "criteo-synthetic.csv"

    def write(tmp: Path) -> None:
        import numpy as np

        rng = np.random.default_rng(2021)
        columns = ["", "label"] + [f"I{i}" for i in range(1, CRITEO_DENSE + 1)]
        columns += [f"C{i}" for i in range(1, len(CRITEO_CARDINALITIES) + 1)]
        cells: list[Any] = [np.arange(n_rows), (rng.random(n_rows) < 0.25).astype(np.int64)]
        for _ in range(CRITEO_DENSE):
            counts = rng.geometric(rng.uniform(0.01, 0.5), size=n_rows) - 1  # Criteo's I columns are counts
            cells.append(counts / counts.max())
        for n in CRITEO_CARDINALITIES:
            p = 1.0 / np.arange(1, n + 1)
            cells.append(rng.permutation(n)[rng.choice(n, size=n_rows, p=p / p.sum())])
        with open(tmp, "w") as f:
            f.write(",".join(columns) + "\n")
            for row in zip(*cells):
                f.write(",".join(f"{v:.6f}" if isinstance(v, float) else str(v) for v in row) + "\n")

    return base._atomic_write(path, write)


def _patch_warmup_callback() -> None:
    """Let LearningRateWarmupCallback be built without initial_lr, meaning: the optimizer's rate when
    training begins (what Horovod's own on_train_begin still does when initial_lr is None)."""
    from horovod.tensorflow.keras.callbacks import LearningRateWarmupCallback

    init = LearningRateWarmupCallback.__init__

    def init_optional(self: Any, initial_lr: Any = None, *args: Any, **kwargs: Any) -> None:
        init(self, 0.0 if initial_lr is None else initial_lr, *args, **kwargs)  # 0.28.1 refuses None here
        if initial_lr is None:
            self.initial_lr = None  # read from model.optimizer.lr in on_train_begin

    LearningRateWarmupCallback.__init__ = init_optional


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("--"):
        print(__doc__)
        return 2
    script = Path(args[0]).resolve()
    spec = SCRIPTS.get(script.name, Spec())
    k = int(os.environ.get("CONFORMANCE_STEPS", "5"))

    default_base = Path(tempfile.gettempdir()) / "memdiag-conformance"
    data_dir = Path(os.environ.get("CONFORMANCE_DATA_DIR") or default_base / "data").resolve()
    run_dir = base._run_dir(default_base)
    (run_dir / "home" / ".keras").mkdir(parents=True, exist_ok=True)
    os.environ["HOME"] = str(run_dir / "home")
    os.chdir(run_dir)

    if spec.text8_link:
        link = run_dir / spec.text8_link
        if not link.exists():
            with contextlib.suppress(FileExistsError):  # the other rank made it first
                link.symlink_to(base.synthetic_text8(data_dir))
    if spec.criteo_link:
        link = run_dir / spec.criteo_link
        if not link.exists():
            with contextlib.suppress(FileExistsError):  # the other rank made it first
                link.symlink_to(synthetic_criteo(data_dir))
    if spec.sagemaker_imdb:
        channel = str(synthetic_imdb(data_dir))
        os.environ.setdefault("SM_CHANNEL_TRAIN", channel)
        os.environ.setdefault("SM_CHANNEL_TEST", channel)
        os.environ.setdefault("SM_MODEL_DIR", str(run_dir / f"model-{base._env_rank()}"))
    if spec.stubs:
        sys.path.insert(0, str(STUBS))

    base._patch_caps(spec.caps, k)
    if spec.warmup_without_initial_lr:
        _patch_warmup_callback()
    if spec.tf1:
        base._swap_to_tf1(spec.tf1, False)

    sys.argv = [str(script)] + args[1:]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except base._StepCapReached:
        print(f"conformance: stopped after {k} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
