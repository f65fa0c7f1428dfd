"""Users' scripts measured as written: the collectives plain Horovod issues, the script's output unchanged,
its choices recorded; auto agreed across ranks; compare on a script gives a correctness result."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memdiag.analyze.timeline import record_collectives, timeline_collectives, unshaped_ops
from memdiag.format.rundir import read_timeline
from tests.helpers import ROOT, memdiag, read_json, read_records, undeclared_record_fields

pytestmark = pytest.mark.mpi

# Each an ordinary Horovod script (examples/README.md), with the arguments of a short run. The core
# tier runs the scripts whose paths memdiag once changed or missed; the rest run in the slow tier (Adasum's
# as written among them, about 22 s on 2 cores: test_auto_under_adasum_densifies_what_horovod_cannot_gather
# runs the same script in the core tier).
CORE = ("user_sparse_as_dense.py", "user_groups.py", "user_process_set.py", "user_tf1_graph.py")
SCRIPTS = {
    "user_tape_eager.py": ["--steps", "3", "--tokens", "256"],
    "user_tape_function.py": ["--steps", "3"],
    "user_keras_fit.py": ["--batches", "3"],
    "user_sparse_as_dense.py": ["--steps", "3"],
    "user_sum_op.py": ["--steps", "3"],
    "user_adasum.py": ["--steps", "3"],
    "user_fp16_compression.py": ["--steps", "3"],
    "user_groups.py": ["--steps", "3"],
    "user_process_set.py": ["--steps", "3"],
    "user_alltoall.py": ["--steps", "3"],
    "user_sync_batchnorm.py": ["--steps", "3"],
    "user_backward_passes.py": ["--steps", "4"],
    "user_repetitive_lookups.py": ["--steps", "3", "--vocab", "200000", "--tokens", "16384"],
    "user_tf1_graph.py": ["--steps", "3"],
}
OUTPUT_LINE = re.compile(r"^(step \d+ loss \S+|final \S+)$", re.M)


def plain_mpirun(script: Path, args: list[str], timeline: Path, ranks: int = 2) -> subprocess.CompletedProcess:
    """The script under plain mpirun, as its user runs it, with Horovod's own timeline (let finish
    writing before the script's processes exit: plain_script.py)."""
    env = {**os.environ, "HOROVOD_TIMELINE": str(timeline), "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "-x", "HOROVOD_TIMELINE",
           "-x", "TF_CPP_MIN_LOG_LEVEL"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    wrapper = Path(__file__).with_name("plain_script.py")
    return subprocess.run([*cmd, sys.executable, str(wrapper), str(script), *args], capture_output=True, text=True,
                          timeout=300, env=env, stdin=subprocess.DEVNULL)


# Every script runs with memdiag's marks as they are by default (the native op: memdiag.nativemarks); these
# run again with the marks made through Python (MEMDIAG_MARKS=python): a grouped all-reduce (one mark per
# tensor) and a TF1 graph (only what a session fetches runs).
PYTHON_MARKS = ("user_groups.py", "user_tf1_graph.py")
# By default the native marks are made records once a second (the native timer samples, the sampling thread
# drains in batches); these run again with them made records at every step (--record-every 0, the Python
# thread sampling): the same collectives recorded either way.
EVERY_STEP = ("user_sparse_as_dense.py",)


# A script's plain run (its output and Horovod's timeline of what it issued), made once for its runs with
# both kinds of marks.
_PLAIN: dict[str, tuple[subprocess.CompletedProcess, list]] = {}


def plain_run(name: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list]:
    if name not in _PLAIN:
        plain = plain_mpirun(ROOT / "examples" / name, SCRIPTS[name], tmp_path / "plain-timeline.json")
        assert plain.returncode == 0, plain.stdout + plain.stderr
        _PLAIN[name] = plain, timeline_collectives(read_timeline(str(tmp_path / "plain-timeline.json")).events)
    return _PLAIN[name]


@pytest.mark.parametrize("name,marks", [(name, "native") if name in CORE else
                                        pytest.param(name, "native", marks=pytest.mark.slow)
                                        for name in sorted(SCRIPTS)] + [(name, "python") for name in PYTHON_MARKS]
                         + [(name, "every-step") for name in EVERY_STEP])
def test_a_script_runs_under_memdiag_exactly_as_under_plain_mpirun(name, marks, runs_root, tmp_path, monkeypatch):
    script, args = ROOT / "examples" / name, SCRIPTS[name]
    # GIVEN the script's run under plain mpirun, with Horovod's timeline of what it issued
    plain, issued = plain_run(name, tmp_path)
    assert issued
    # WHEN memdiag runs it as written (no mode given), its marks inside graphs made as asked
    out = runs_root / f"as-written-{script.stem}-{marks}"
    every_step = marks == "every-step"
    monkeypatch.setenv("MEMDIAG_MARKS", "native" if every_step else marks)
    result = memdiag("run", str(script), "-n", "2", "--horovod-timeline", "--out", str(out),
                     *(["--record-every", "0"] if every_step else []), "--", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    batched = marks == "native"
    for rank in (0, 1):
        [start] = [r for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "start"]
        assert start["marks"] == ("python" if marks == "python" else "native")
        assert (start["sampling"], start["record_every_s"]) == (("native", 1.0) if batched else ("python", 0.0))
        # the marks' file of a rank that ended is deleted: every mark is in its records
        assert start["marks_file"] is (marks != "python")
        assert not (out / f"rank-{rank}.marks.bin").exists() and not (out / f"rank-{rank}.marks.keys").exists()
    if batched:
        assert "marks made records every 1 s (--record-every)" in " ".join(result.stdout.split())
    # THEN Horovod issued the same collectives (op, dtype, output shape, count) under memdiag
    under = timeline_collectives(read_timeline(str(out / "horovod-timeline.json")).events)
    assert under == issued
    # AND memdiag's own records of rank 0 name exactly those collectives
    assert record_collectives(read_records(out / "rank-0.jsonl"), unshaped_ops(issued)) == issued
    # AND the script printed the same losses and final parameters
    log = (out / "mpirun.log").read_text()
    assert OUTPUT_LINE.findall(log) == OUTPUT_LINE.findall(plain.stdout)
    # AND the run says it changed nothing and records what the script asked Horovod for
    summary = read_json(out / "summary.json")
    assert summary["mode"] == "as-written" and summary["changes_to_job"] == []
    assert any(c["api"] == "gradient reduction" for c in summary["script_choices"])
    assert all(not p["overridden"] for p in summary["policy"])
    assert summary["steps_recorded"] >= 2


def test_the_scripts_choices_are_recorded_and_an_override_is_reported(runs_root):
    script = ROOT / "examples" / "user_sparse_as_dense.py"
    out = runs_root / "as-written-override"
    result = memdiag("run", str(script), "-n", "2", "--mode", "sparse", "--out", str(out), "--", "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(out / "summary.json")
    asked = next(c for c in summary["script_choices"] if c["api"] == "gradient reduction")
    assert asked["sparse_as_dense"] is True and asked["op"] == "average"
    [policy] = summary["policy"]
    assert policy["decision"] == "sparse" and policy["overridden"] and policy["script_sparse_as_dense"]
    assert any("--mode sparse" in change for change in summary["changes_to_job"])
    assert "sparse_as_dense=True" in result.stdout
    # the embedding gradient was allgathered although the script asked for a dense allreduce
    assert any(c["op"] == "allgather" and c["sparse"] for c in summary["collectives"])
    assert undeclared_record_fields(out) == {}  # a script's records (choices are open: any argument)


def test_process_set_and_reduce_op_size_the_records(runs_root):
    out = runs_root / "as-written-sum"
    result = memdiag("run", str(ROOT / "examples" / "user_sum_op.py"), "-n", "2", "--out", str(out),
                     "--", "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_json(out / "summary.json")
    values = next(c for c in summary["collectives"] if c["op"] == "allgather" and c["part"] == "values")
    assert values["reduce_op"] == "sum" and values["process_set_size"] == 2


UNEVEN = '''
import sys
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

if sys.argv[1] == "tf1":  # a TF1-style graph, run by a session
    tf.compat.v1.disable_eager_execution()
hvd.init()
tf.keras.utils.set_random_seed(3)
table = tf.Variable(tf.random.normal([64, 8]))
rows = 28 + hvd.rank()  # rank 0 alone would keep allgather (2016 B <= 2048 B), rank 1 alone densify
ids = tf.constant(np.arange(rows) % 64, tf.int32)

def step(ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, ids) ** 2)
    tape = hvd.DistributedGradientTape(tape)
    [grad] = tape.gradient(loss, [table])
    return table.assign_sub(0.01 * tf.convert_to_tensor(grad))

if sys.argv[1] == "function":  # each rank traces its own static row count
    step = tf.function(step)
elif sys.argv[1] == "dynamic":  # a batch of unknown size: the rows are known only when the step runs
    step = tf.function(step, input_signature=[tf.TensorSpec([None], tf.int32)])
if sys.argv[1] == "tf1":
    update = step(ids)
    with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            session.run(update)
        print("final", float(session.run(tf.reduce_sum(table))), flush=True)
    sys.exit(0)
for _ in range(3):
    step(ids)
print("final", float(tf.reduce_sum(table)), flush=True)
'''


@pytest.mark.parametrize("style", [pytest.param("eager", marks=pytest.mark.slow), "function", "dynamic", "tf1"])
def test_ranks_with_batches_straddling_the_crossover_take_the_same_path(style, runs_root, tmp_path):
    script = tmp_path / "uneven.py"
    script.write_text(UNEVEN)
    out = runs_root / f"uneven-{style}"
    result = memdiag("run", str(script), "-n", "2", "--mode", "auto", "--timeout", "120", "--out", str(out),
                     "--", style)
    # no stall: both ranks finished
    assert result.returncode == 0, result.stdout + result.stderr
    policies = [p for rank in (0, 1) for p in read_records(out / f"rank-{rank}.jsonl") if p["type"] == "policy"]
    assert [p["local_rows"] for p in policies] == [28, 29]
    # the same decision on both ranks, from the larger row count: 2 x 29 x (32 + 4) B > 64 x 8 x 4 B
    assert [p["decision"] for p in policies] == ["dense", "dense"]
    assert [p["agreed_rows"] for p in policies] == [29, 29] and policies[0]["gathered_bytes"] == 2088
    for rank in (0, 1):
        ops = {r["op"] for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "collective"}
        assert ops == {"allreduce"}


def test_compare_on_a_seeded_script_gives_a_correctness_result(runs_root):
    out = runs_root / "compare-script"
    result = memdiag("compare", "sparse-vs-dense", str(ROOT / "examples" / "user_tape_function.py"),
                     "-n", "2", "--modes", "sparse,dense", "--steps", "2", "--out", str(out), "--", "--steps", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    correctness = read_json(out / "compare.json")["correctness"]
    assert correctness["passed"] is True
    compared = [c for c in correctness["checks"] if c["passed"] is not None]
    assert compared and all(c["max_abs_diff"] is not None for c in compared)
    assert correctness["reduction"]["passed"] is True


# The extended tier: the core tier's test_compare.py fails the same injected fault on the built-in workload
# (with its second look), and test_compare_on_a_seeded_script_gives_a_correctness_result passes a script's
# reduction check; this comparison with its second look costs about 45 s on 2 cores.
@pytest.mark.slow
def test_compare_on_a_script_with_a_wrong_reduction_fails(runs_root):
    out = runs_root / "compare-script-fault"
    result = memdiag("compare", "sparse-vs-dense", str(ROOT / "examples" / "user_tape_function.py"),
                     "-n", "2", "--modes", "sparse,dense", "--inject-fault", "sum-densified",
                     "--out", str(out), "--", "--steps", "3")
    assert result.returncode == 1
    correctness = read_json(out / "compare.json")["correctness"]
    assert correctness["passed"] is False and correctness["reduction"]["passed"] is False


def test_auto_under_adasum_densifies_what_horovod_cannot_gather(runs_root):
    # The script asks sparse_as_dense=True because Horovod raises for an IndexedSlices under Adasum; auto
    # sees the op and densifies (it chose the allgather from the sizes, and the job failed, before).
    out = runs_root / "adasum-auto"
    done = memdiag("run", str(ROOT / "examples" / "user_adasum.py"), "-n", "2", "--mode", "auto", "--out", str(out),
                   "--", "--steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    [policy] = read_json(out / "summary.json")["policy"]
    assert policy["decision"] == "dense" and "op adasum has no allgather path" in policy["reason"]
