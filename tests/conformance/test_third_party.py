"""The third-party tier: Horovod training scripts from other projects' repositories (not Horovod's own), each
with embedding tables whose gradients TensorFlow hands to Horovod as tf.IndexedSlices (but one script's, which
its own regulariser makes dense: scripts.json's dense_tables), vendored byte for byte with their licences
(tests/conformance/third_party/*/SOURCES.md) and run unchanged on 2 ranks through
tests/conformance/third_party/launch.py (local data, a step count from CONFORMANCE_STEPS, the stand-ins and
shims its docstring lists), under plain mpirun and under ``memdiag run``.

Every script, as written: the same exit status as plain mpirun (0), no bookkeeping warning, every
gradient's collective named after its variable and the IndexedSlices ones exactly the script's tables; an
embedding table whose gradient the script makes dense (horovod_criteo_deepctr.py: deepctr's regulariser)
allreduced whole under its own name, as large as the data makes the table. Under --mode dense, sparse and
auto: the mode the report names is the mode the records show, for every table; for a script with no
IndexedSlices, that the mode changed no reduction. docs/notes/third-party-scripts.md has what was run and
measured.

The memdiag runs are shared between the tests (``memdiag_run``: one per script, mode and step count), and
so is the generated data (``data_dir``).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conformance.checks import as_written
from tests.helpers import ROOT, read_json, read_records

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

HERE = Path(__file__).resolve().parent / "third_party"
LAUNCH = HERE / "launch.py"
TABLE = json.loads((HERE / "scripts.json").read_text())["scripts"]
SENTIMENT = "tests/conformance/third_party/amazon_sagemaker_examples/sentiment-distributed.py.txt"
SENTIMENT_ROWS = 8 * 400  # --batch_size 8 reviews of 400 tokens: the embedding gradient's rows per rank and step
WORD2VEC = "tests/conformance/third_party/machine_learning_notebooks/tf_horovod_word2vec.py"
WORD2VEC_MOST_ROWS = 128  # its batch: 64 to 128 (max_batch_size) words a rank and step, one embedding row each
GPT2 = "tests/conformance/third_party/gpt_2/train-horovod.py"
GPT2_ROWS = 2 * 1024  # --batch_size 2 samples of 1024 tokens (data_sampler.sample(1024)): wpe's rows per rank and step
GPT2_POSITIONS = 1024  # the positions those rows look up, 0 to 1023 in each sample: wpe's distinct rows
CRITEO_CSV = "criteo-synthetic.csv"  # launch.py's synthetic_criteo, in the data directory
MODES = ("dense", "sparse", "dedup", "auto")
MODE_RUNS = [pytest.param(entry, mode, id=f"{Path(entry['path']).stem}-{mode}")
             for entry in TABLE for mode in entry.get("modes", MODES)]


def _id(entry: dict) -> str:
    return Path(entry["path"]).stem


def _entry(path: str) -> dict:
    [entry] = [e for e in TABLE if e["path"] == path]
    return entry


def _env(entry: dict, workdir: Path, data_dir: Path, steps: int | None = None) -> dict[str, str]:
    env = {**os.environ, **entry["env"], "CONFORMANCE_WORKDIR": str(workdir), "CONFORMANCE_DATA_DIR": str(data_dir)}
    return {**env, "CONFORMANCE_STEPS": str(steps)} if steps else env


def plain(entry: dict, workdir: Path, data_dir: Path) -> subprocess.CompletedProcess:
    cmd = ["mpirun", "-np", "2", "--oversubscribe"]  # as a user runs it: mpirun's own binding, as memdiag's
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return subprocess.run([*cmd, sys.executable, str(LAUNCH), str(ROOT / entry["path"]), *entry["args"]],
                          capture_output=True, text=True, timeout=600, env=_env(entry, workdir, data_dir), cwd=ROOT,
                          stdin=subprocess.DEVNULL)


def under_memdiag(entry: dict, workdir: Path, out: Path, data_dir: Path, mode: str | None = None,
                  steps: int | None = None) -> subprocess.CompletedProcess:
    args = ["run", str(LAUNCH), "-n", "2", "--out", str(out), *(["--mode", mode] if mode else []),
            "--", str(ROOT / entry["path"]), *entry["args"]]
    return subprocess.run([sys.executable, "-m", "memdiag", *args], capture_output=True, text=True, timeout=600,
                          env={**_env(entry, workdir, data_dir, steps), "COLUMNS": "160"}, cwd=ROOT,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """One data directory for the module's runs: each data set is generated once, by the first run needing it."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def memdiag_run(tmp_path_factory, data_dir):
    """``memdiag_run(entry, mode=None, steps=None) -> (CompletedProcess, run directory)``: the run of that script
    under memdiag with that mode and step count (None: the entry's), made once and shared by the tests."""
    done: dict[tuple, tuple[subprocess.CompletedProcess, Path]] = {}

    def run(entry: dict, mode: str | None = None, steps: int | None = None) -> tuple[subprocess.CompletedProcess, Path]:
        key = (entry["path"], mode, steps or int(entry["env"]["CONFORMANCE_STEPS"]))
        if key not in done:
            tmp = tmp_path_factory.mktemp(f"{Path(entry['path']).stem}-{mode or 'as-written'}-{key[2]}")
            done[key] = (under_memdiag(entry, tmp / "work", tmp / "run", data_dir, mode, steps=key[2]), tmp / "run")
        return done[key]

    return run


def criteo_table_rows(data_dir: Path) -> dict[str, int]:
    """The rows of each embedding table horovod_criteo_deepctr.py builds, read from the CSV it was given: the
    script sizes the tables of column C<k> (``sparse_emb_C<k>``, 64 wide, and ``linear0sparse_emb_C<k>``, 1
    wide) as the column's largest id + 1."""
    with open(data_dir / CRITEO_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    columns = [c for c in rows[0] if c.startswith("C")]
    return {f"{prefix}sparse_emb_{c}/embeddings:0": max(int(r[c]) for r in rows) + 1
            for c in columns for prefix in ("", "linear0")}


def check_dense_tables(entry: dict, summary: dict, data_dir: Path) -> None:
    """For horovod_criteo_deepctr.py: every table of the entry's dense_tables, and only those, is one the CSV
    makes, and each is allreduced whole (a gradient of the table's shape, neither gathered nor densified by
    memdiag) under its own name; no collective of the run is an IndexedSlices or densified."""
    rows = criteo_table_rows(data_dir)
    assert sorted(rows) == sorted(entry["dense_tables"]), sorted(rows)
    reduced = {c["name"]: c for c in summary["collectives"] if c["op"] == "allreduce"}
    for name, n in rows.items():
        c = reduced.get(name)
        assert c is not None, (name, sorted(reduced))
        width = 1 if name.startswith("linear0") else 64
        assert (c["shape_in"], c["sparse"], c["densified"]) == ([n, width], False, False), (name, n, c)
    assert not [c for c in summary["collectives"] if c["sparse"] or c["densified"]]


@pytest.mark.parametrize("entry", TABLE, ids=_id)
def test_each_third_party_script_exits_as_under_plain_mpirun_with_its_tables_named(entry, tmp_path, data_dir,
                                                                                  memdiag_run):
    # GIVEN a third-party script, unchanged, on 2 ranks
    # WHEN it runs under plain mpirun and under memdiag as written
    expected = plain(entry, tmp_path / "plain", data_dir)
    done, run = memdiag_run(entry)
    # THEN both exit 0, memdiag changed nothing and warned of nothing, every gradient's collective is named
    # after its variable, and the IndexedSlices ones are exactly the script's embedding tables
    as_written(expected, done, run, entry["tables"])
    # AND they are gathered, as the script asked
    summary = read_json(run / "summary.json")
    assert {c["op"] for c in summary["collectives"] if c["sparse"]} == ({"allgather"} if entry["tables"] else set())
    # AND a table the script makes dense is allreduced whole, under its own name
    if entry.get("dense_tables"):
        check_dense_tables(entry, summary, data_dir)


@pytest.mark.parametrize(("entry", "mode"), MODE_RUNS)
def test_each_third_party_script_under_a_mode_is_reduced_as_the_report_names_it(entry, mode, data_dir, memdiag_run):
    # GIVEN a third-party script, unchanged, and a mode that overrides its sparse_as_dense
    # WHEN it runs under memdiag with that mode
    done, run = memdiag_run(entry, mode)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = read_json(run / "summary.json")
    assert summary["warnings"] == [], summary["warnings"]
    # THEN the report says the mode was applied to every table, each named after its variable
    applied = summary["mode_applied"]
    assert applied["mode"] == mode
    assert applied["applied"] == entry["tables"] and applied["not_applied"] == [] and applied["unlabelled"] == []
    # AND the records show it: dense densifies every table, sparse gathers every one; auto does what
    # its decision for each table says
    gathered = {c["name"] for c in summary["collectives"] if c["sparse"] and c["op"] == "allgather"}
    densified = {c["name"] for c in summary["collectives"] if c["densified"]}
    if mode == "dense":
        assert gathered == set() and densified == set(entry["tables"])
    elif mode == "sparse":
        assert gathered == set(entry["tables"]) and densified == set()
    elif mode == "dedup":  # every table merged before its allgather, none gathered as it was
        merged = {c["name"] for c in summary["collectives"] if c["merged"]}
        assert gathered == merged == set(entry["tables"]) and densified == set()
    else:
        decisions = {p["name"]: p["decision"] for p in summary["policy"]}
        assert set(decisions) == set(entry["tables"])
        assert densified == {name for name, decision in decisions.items() if decision == "dense"}
        assert gathered == {name for name, decision in decisions.items() if decision in ("sparse", "dedup")}
    # AND where the script has no IndexedSlices, the report says the mode changed nothing, and the tables the
    # script makes dense are still allreduced whole under their names
    if not entry["tables"]:
        assert f"--mode {mode}: the records show no IndexedSlices gradient, so it changed no reduction" in " ".join(
            done.stdout.split())
    if entry.get("dense_tables"):
        check_dense_tables(entry, summary, data_dir)


@pytest.mark.parametrize(("path", "mode", "steps", "table", "most_rows"), [
    pytest.param(SENTIMENT, "dedup", 6, "embedding/embeddings:0", SENTIMENT_ROWS, id="sentiment-dedup"),
    pytest.param(WORD2VEC, "dense", 3, "Variable:0", WORD2VEC_MOST_ROWS, id="word2vec-dense"),
    pytest.param(GPT2, "dense", 3, "model/wpe:0", GPT2_ROWS, id="gpt2-dense"),
])
def test_each_distinct_rows_record_counts_toward_the_step_whose_rows_it_counted(path, mode, steps, table, most_rows,
                                                                              memdiag_run):
    # GIVEN a third-party script whose table's rows memdiag counts on every step (distinct_rows records):
    # merged before the gather (dedup), or densified (dense)
    entry = _entry(path)
    # WHEN it runs under memdiag with that mode
    done, run = memdiag_run(entry, mode, steps)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = read_json(run / "summary.json")
    # THEN each rank wrote one distinct_rows record of the table per step, as many as the steps of its
    # gradient collectives (a record's own step stamp can lag: it counts in the graph before the step's
    # collectives mark the step; the summary places it by the step whose time span holds it)
    for rank in (0, 1):
        records = read_records(run / f"rank-{rank}.jsonl")
        counted = [r for r in records if r.get("type") == "distinct_rows" and r.get("name") == table]
        reduced = sorted({r["step"] for r in records if r.get("type") == "collective" and r.get("gradient")
                          and r.get("name") == table})
        assert len(counted) == steps and reduced == list(range(steps)), (rank, counted, reduced)
    # AND the summary's distinct rows cover every rank and step
    [rows] = [d for d in summary["distinct_rows"] if d["name"] == table]
    assert sorted(rows["distinct_rows_per_rank"]) == ["0", "1"] and rows["steps"] == steps, rows
    # AND each rank's own rows are one step's, at most the batch's
    [policy] = [p for p in summary["policy"] if p["name"] == table]
    own = policy["own_rows_by_rank"]
    assert sorted(own) == ["0", "1"] and max(own.values()) <= most_rows, own
    if path == SENTIMENT:  # every step has the same rows
        assert own == {"0": most_rows, "1": most_rows} and policy["rows_gathered"] == 2 * most_rows, policy
    if path == GPT2:  # every step looks up each of the 1024 positions twice, once per sample
        counts = {(r["rows"], r["distinct_rows"]) for rank in (0, 1) for r in read_records(run / f"rank-{rank}.jsonl")
                  if r.get("type") == "distinct_rows" and r.get("name") == table}
        assert counts == {(GPT2_ROWS, GPT2_POSITIONS)}, counts


def test_the_vendored_third_party_files_are_byte_for_byte_those_their_sources_md_names():
    # GIVEN each vendored folder's SOURCES.md (file, original path, sha256)
    folders = sorted(p.parent for p in HERE.glob("*/SOURCES.md"))
    assert len(folders) == len({Path(e["path"]).parent.name for e in TABLE}) >= 2
    for folder in folders:
        listed = dict(re.findall(r"^\| (\S+) \| .+ \| ([0-9a-f]{64}) \|$", (folder / "SOURCES.md").read_text(), re.M))
        # THEN it lists every file of the folder but its own notes, and each file has that digest
        present = {p.name for p in folder.iterdir() if p.is_file()} - {"SOURCES.md", "ruff.toml"}
        assert set(listed) == present, (folder.name, sorted(listed), sorted(present))
        for name, digest in listed.items():
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, (folder.name, name)
    # AND every script of scripts.json is one of them, with its repository's commit in full
    for entry in TABLE:
        sources = (ROOT / entry["path"]).parent / "SOURCES.md"
        assert Path(entry["path"]).name in sources.read_text() and entry["commit"] in sources.read_text()
