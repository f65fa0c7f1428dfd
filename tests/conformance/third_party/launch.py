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
* ``train-horovod.py`` (nshepperd/gpt-2; TF1 graph and ``Session``, ``AdamOptimizer.minimize``; its ``src/``
  modules ``model``, ``sample``, ``encoder``, ``load_dataset`` vendored beside it, found as the README's
  ``PYTHONPATH=src`` would, since the script's folder is first on ``sys.path``):
    - ``tensorflow.contrib.training.HParams`` (``model.py``'s import; gone in TensorFlow 2): the stand-in
      ``stubs/tensorflow_contrib/`` put on ``sys.path`` and registered in ``sys.modules`` as
      ``tensorflow.contrib`` and ``tensorflow.contrib.training``, for this script only.
    - A GPT-2 "model" where the script reads it, ``models/tiny/`` (``--model_name tiny``) in the run
      directory: a link to a folder generated once (synthetic_gpt2_model) with ``hparams.json``
      (GPT2_HPARAMS: 2 layers, 2 heads, 32 wide), a byte-level ``encoder.json`` (the 256 byte symbols of
      ``encoder.bytes_to_unicode`` and ``<|endoftext|>``), a ``vocab.bpe`` with its header line and no
      merges, and a checkpoint of the vendored ``model.py``'s variables built with those hyperparameters
      (seeded), which the script restores when there is no ``checkpoint/<run_name>``.
    - The text its ``--dataset`` names: ``gpt2-text.txt`` in the run directory, a link to a seeded plain
      text (synthetic_gpt2_text) of GPT2_TEXT_BYTES.
    - TF1 names (as for word2vec) and the step cap by counting the session's training runs; the script
      loops until ``KeyboardInterrupt``, which the cap never raises, so it neither saves nor samples.
    - ``fire``, ``regex`` and ``tqdm``, installed by the ``test`` extra of pyproject.toml.

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
from collections.abc import Callable
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

# GPT-2's hyperparameters for the generated model (hparams.json): 256 byte tokens and <|endoftext|>, 2 layers of
# 2 heads, 32 wide. n_ctx stays GPT-2's 1024: the script feeds batches of 1024 tokens whatever the model's window
# (``data_sampler.sample(1024)``) and looks up positions 0..1023 in ``wpe`` with tf.gather, which on CPU rejects
# an index past the table (with n_ctx 64: "InvalidArgumentError: ... indices[1,686] = 686 is not in [0, 64)").
GPT2_HPARAMS = {"n_vocab": 257, "n_ctx": 1024, "n_embd": 32, "n_head": 2, "n_layer": 2}
GPT2_TEXT_BYTES = 32768  # one chunk of about as many tokens (bytes): enough for the script's 1024-token samples

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
    tf_contrib: bool = False  # stubs/tensorflow_contrib as tensorflow.contrib (needs stubs)
    gpt2_model: str | None = None  # models/<this name> in the run directory: a link to the generated GPT-2 model
    gpt2_text_link: str | None = None  # a link to the synthetic GPT-2 text, by this name, in the run directory


SCRIPTS: dict[str, Spec] = {
    "sentiment-distributed.py.txt": Spec(caps=("fit",), sagemaker_imdb=True, warmup_without_initial_lr=True),
    "tf_horovod_word2vec.py": Spec(tf1="graph", caps=("session_run",), text8_link="text8.zip", stubs=True),
    "horovod_criteo_deepctr.py": Spec(caps=("fit",), criteo_link="train.csv"),
    "train-horovod.py": Spec(tf1="graph", caps=("session_run",), stubs=True, tf_contrib=True, gpt2_model="tiny",
                             gpt2_text_link="gpt2-text.txt"),
}


def _atomic_folder(folder: Path, write: Callable[[Path], None]) -> Path:
    """``folder``, written by ``write(tmp)`` into a folder of its own and renamed into place unless the other
    rank's is there first (the same data, seeded: then this rank's is dropped)."""
    if not folder.exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
        write(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:  # the other rank's folder is in place (the same data): keep it
            shutil.rmtree(tmp)
    return folder


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

    return _atomic_folder(folder, write)


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


def synthetic_gpt2_text(data_dir: Path, n_bytes: int = GPT2_TEXT_BYTES) -> Path:
    """A seeded plain ASCII text for GPT-2's ``--dataset``: sentences of made-up words, Zipf-distributed,
    with capitals, commas, full stops and paragraphs, so the byte-level encoding sees the symbols of text."""
    path = data_dir / "gpt2-synthetic.txt"

    def write(tmp: Path) -> None:
        import numpy as np

        rng = np.random.default_rng(2019)
        letters = np.array(list("etaoinshrdlucmfwypvbgkjqxz"))
        forms = ["".join(letters[rng.integers(0, 26, size=1 + i % 9)]) for i in range(2000)]
        p = 1.0 / np.arange(1, len(forms) + 1)
        words = iter(rng.choice(len(forms), size=n_bytes, p=p / p.sum()).tolist())
        text = ""
        while len(text) < n_bytes:
            sentence = " ".join(forms[next(words)] for _ in range(int(rng.integers(4, 16))))
            if rng.random() < 0.3:
                sentence = sentence.replace(" ", ", ", 1)
            text += sentence.capitalize() + (".\n\n" if rng.random() < 0.2 else ". ")
        tmp.write_text(text[:n_bytes], encoding="ascii")

    return base._atomic_write(path, write)


def synthetic_gpt2_model(data_dir: Path, source: Path) -> Path:
    """A GPT-2 model folder as the script reads ``models/<model_name>`` (OpenAI's ``download_model.py`` layout, but
    the meta graph): ``hparams.json`` (GPT2_HPARAMS); ``encoder.json``, one token a byte, numbered in the order of
    ``encoder.bytes_to_unicode`` (as GPT-2's own vocabulary begins), then ``<|endoftext|>`` (256); ``vocab.bpe``
    with GPT-2's header line and no merges (``encoder.get_encoder`` skips the first line, so every word stays
    split into its bytes); and ``checkpoint`` with ``model.ckpt.*``: the variables of the vendored ``model.py``
    (``source``) built with those hyperparameters in a graph of its own, seeded, saved by ``tf.train.Saver`` with
    relative paths. Needs the TF1 names and the ``tensorflow.contrib`` stand-in in place (``model.py`` imports
    both); the vendored modules are loaded under private names, so the script's own imports load them anew."""
    folder = data_dir / "gpt2-tiny"

    def load(name: str) -> Any:
        spec = importlib.util.spec_from_file_location(f"conformance_gpt2_{name}", source / f"{name}.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def write(tmp: Path) -> None:
        import json

        import tensorflow as tf  # tensorflow.compat.v1 here (the TF1 swap)

        tmp.mkdir(parents=True)
        symbols = list(load("encoder").bytes_to_unicode().values())
        vocabulary = {symbol: i for i, symbol in enumerate(symbols)}
        vocabulary["<|endoftext|>"] = len(symbols)
        assert len(vocabulary) == GPT2_HPARAMS["n_vocab"], len(vocabulary)
        (tmp / "encoder.json").write_text(json.dumps(vocabulary), encoding="utf-8")
        (tmp / "vocab.bpe").write_text("#version: 0.2\n", encoding="utf-8")
        (tmp / "hparams.json").write_text(json.dumps(GPT2_HPARAMS, indent=2) + "\n")

        model = load("model")
        hparams = model.default_hparams()
        hparams.override_from_dict(GPT2_HPARAMS)
        with tf.Graph().as_default() as graph:
            tf.set_random_seed(2019)
            model.model(hparams=hparams, X=tf.placeholder(tf.int32, [1, None]))
            variables = [v for v in tf.trainable_variables() if "model" in v.name]  # the script's train_vars
            saver = tf.train.Saver(var_list=variables, save_relative_paths=True)
            with tf.Session(graph=graph) as sess:
                sess.run(tf.variables_initializer(variables))
                saver.save(sess, str(tmp / "model.ckpt"), write_meta_graph=False)

    return _atomic_folder(folder, write)


def _register_tf_contrib() -> None:
    """``tensorflow.contrib`` and ``tensorflow.contrib.training`` as the stand-in of stubs/ (on sys.path by then):
    an import finds a module in ``sys.modules`` by its full name before it looks in its parent package."""
    import tensorflow_contrib
    import tensorflow_contrib.training

    sys.modules.setdefault("tensorflow.contrib", tensorflow_contrib)
    sys.modules.setdefault("tensorflow.contrib.training", tensorflow_contrib.training)


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
    if spec.gpt2_text_link:
        link = run_dir / spec.gpt2_text_link
        if not link.exists():
            with contextlib.suppress(FileExistsError):  # the other rank made it first
                link.symlink_to(synthetic_gpt2_text(data_dir))
    if spec.stubs:
        sys.path.insert(0, str(STUBS))

    base._patch_caps(spec.caps, k)
    if spec.warmup_without_initial_lr:
        _patch_warmup_callback()
    if spec.tf1:
        base._swap_to_tf1(spec.tf1, False)
    if spec.tf_contrib:  # after the imports of the swap: nothing of TensorFlow's or Horovod's own sees it
        _register_tf_contrib()
    if spec.gpt2_model:  # after the TF1 swap and the stand-in: the checkpoint is made with the vendored model.py
        link = run_dir / "models" / spec.gpt2_model
        if not link.exists():
            link.parent.mkdir(exist_ok=True)
            with contextlib.suppress(FileExistsError):  # the other rank made it first
                link.symlink_to(synthetic_gpt2_model(data_dir, script.parent))

    sys.argv = [str(script)] + args[1:]
    sys.path.insert(0, str(script.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except base._StepCapReached:
        print(f"conformance: stopped after {k} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
