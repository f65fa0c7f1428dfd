"""memdiag is invisible to Horovod: a script run as written answers, prints and exits as under plain mpirun,
Horovod's own errors included, and memdiag's own failures are warnings, never the script's failure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memdiag.formula import gathered_values_bytes
from tests.helpers import ROOT, memdiag, read_json, read_records
from tests.integration.test_as_written import plain_mpirun

pytestmark = pytest.mark.mpi

ERRORS = Path(__file__).with_name("horovod_errors.py")
ANSWER = re.compile(r"^(?:eager|function|graph) .*$|^done$", re.M)


@pytest.fixture(scope="module")
def wrong_calls(runs_root, tmp_path_factory):
    """The same script of wrong calls to Horovod, under plain mpirun and under memdiag as written."""
    plain = plain_mpirun(ERRORS, [], tmp_path_factory.mktemp("plain") / "timeline.json")
    out = runs_root / "horovod-errors"
    under = memdiag("run", str(ERRORS), "-n", "2", "--timeout", "300", "--out", str(out))
    return plain, under, out


def test_horovods_own_errors_reach_the_script_unchanged(wrong_calls):
    plain, under, out = wrong_calls
    assert plain.returncode == 0, plain.stdout + plain.stderr
    answers = ANSWER.findall(plain.stdout)
    # GIVEN a script whose calls Horovod refuses (several raise NotImplementedError) ...
    assert sum("raised NotImplementedError" in a for a in answers) >= 5 and answers[-1] == "done"
    # THEN under memdiag every call got the same answer, in the same order
    assert ANSWER.findall((out / "mpirun.log").read_text()) == answers


def test_a_call_horovod_refuses_is_left_to_it_without_memdiag_failing_to_label_it(wrong_calls):
    _, under, out = wrong_calls
    # GIVEN IndexedSlices with an op Horovod refuses, one of them with a Python list for values (as
    # Horovod's own test file makes them): Horovod raises before any collective runs
    failed = [r["what"] for r in read_records(out / "rank-0.jsonl") if r["type"] == "bookkeeping"
              and r["what"].startswith("label")]
    # THEN memdiag leaves those calls to Horovod without labelling them: the one label that failed is the
    # script's allreduce of a plain Python list, which Horovod cannot reduce either (AttributeError)
    assert failed == ["label an allreduce"]
    assert "could not label a grouped" not in under.stdout


def test_a_script_that_succeeds_gives_a_run_that_succeeded(wrong_calls):
    _, under, out = wrong_calls
    # a graph gone out of scope left variables memdiag cannot read at the end: not the script's failure
    assert under.returncode == 0, under.stdout + under.stderr
    manifest = read_json(out / "run.json")
    assert manifest["status"] == "ok"
    ends = [r for rank in (0, 1) for r in read_records(out / f"rank-{rank}.jsonl") if r["type"] == "end"]
    assert [e["status"] for e in ends] == ["ok", "ok"]


def test_the_graph_modes_collectives_are_recorded_with_their_shapes(wrong_calls):
    _, _, out = wrong_calls
    records = [r for r in read_records(out / "rank-0.jsonl") if r["type"] == "collective"]
    # the TF1-graph tape's gradient of 4 looked-up rows of a 16 x 4 table, gathered from 2 ranks
    gathered = [r for r in records if r["name"] == "table:0" and r["op"] == "allgather" and r["part"] == "values"]
    assert gathered and all(r["shape_in"] == [4, 4] and r["shape_out"] == [8, 4] for r in gathered)
    assert all(r["bytes_out"] == 2 * 4 * 4 * 4 for r in gathered)


SABOTAGE = '''
import horovod.tensorflow as hvd
import tensorflow as tf
import memdiag.agent.parameters as parameters

def broken(*args):
    raise RuntimeError("digest broken on purpose")

parameters.digest_and_save = broken  # memdiag's bookkeeping fails; the script's training must not
hvd.init()
table = tf.Variable(tf.ones([8, 2]))
for _ in range(2):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [1, 2]) ** 2)
    [grad] = hvd.DistributedGradientTape(tape).gradient(loss, [table])
    table.assign_sub(0.1 * tf.convert_to_tensor(grad))
print("trained", flush=True)
'''


def test_memdiags_own_failure_is_a_warning_and_not_the_scripts_failure(runs_root, tmp_path):
    script = tmp_path / "sabotage.py"
    script.write_text(SABOTAGE)
    out = runs_root / "sabotaged-bookkeeping"
    result = memdiag("run", str(script), "-n", "2", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert read_json(out / "run.json")["status"] == "ok"
    warnings = read_json(out / "summary.json")["warnings"]
    assert any("could not save the final parameters" in w and "digest broken on purpose" in w for w in warnings)
    assert "could not save the final parameters" in result.stdout


@pytest.mark.parametrize("code", [0, 3])
def test_the_scripts_exit_status_is_the_runs(code, runs_root, tmp_path):
    script = tmp_path / "exits.py"
    script.write_text("import sys\nimport horovod.tensorflow as hvd\nimport tensorflow as tf\nhvd.init()\n"
                      "print(hvd.allreduce(tf.constant(1.0)).numpy(), flush=True)\nsys.exit(int(sys.argv[1]))\n")
    out = runs_root / f"exits-{code}"
    result = memdiag("run", str(script), "-n", "2", "--out", str(out), "--", str(code))
    assert result.returncode == (0 if code == 0 else 3), result.stdout + result.stderr
    assert read_json(out / "run.json")["status"] == ("ok" if code == 0 else "failed")


def test_a_tf1_graph_scripts_embedding_allgather_is_named_and_sized_by_the_formula(runs_root):
    out = runs_root / "tf1-graph"
    result = memdiag("run", str(ROOT / "examples" / "user_tf1_graph.py"), "-n", "2", "--out", str(out),
                     "--", "--steps", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    records = [r for r in read_records(out / "rank-1.jsonl") if r["type"] == "collective"]
    values = [r for r in records if r["op"] == "allgather" and r["name"] == "embeddings:0" and r["part"] == "values"]
    # 384 tokens per rank (32 sequences of 12), width 32, float32, gathered from 2 ranks: every step
    assert len(values) == 3 and all(r["sparse"] and not r["densified"] for r in values)
    assert all(r["bytes_out"] == gathered_values_bytes(2, 384, 32 * 4) == 2 * 384 * 32 * 4 for r in values)
    dense = {r["name"] for r in records if r["op"] == "allreduce" and r["gradient"]}
    assert dense == {"head/kernel:0", "head/bias:0"}
    finals = [r for r in read_records(out / "rank-0.jsonl") if r["type"] == "params_final"]
    assert finals and finals[0]["variables"] == 3 and finals[0]["digest"]


AUTOGRAPH_VERBOSE = '''
import runpy, sys
import tensorflow as tf
tf.autograph.set_verbosity(3, alsologtostdout=True)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''
# autograph's word for a function it converts (not one it calls as it is: an artifact, TensorFlow's own)
CONVERTED = re.compile(r"^Not allowed: (<(?:function|bound method) [^ >]+)[^\n]*: default rule$", re.M)


def test_autograph_converts_horovods_functions_under_memdiag_as_under_plain_mpirun(runs_root, tmp_path):
    # GIVEN a tf.function step calling Horovod's DistributedGradientTape, with autograph saying what it converts
    script = tmp_path / "verbose_autograph.py"
    script.write_text(AUTOGRAPH_VERBOSE)
    target = [str(ROOT / "examples" / "user_tape_function.py"), "--steps", "1"]
    plain = plain_mpirun(script, target, tmp_path / "timeline.json")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    out = runs_root / "autograph-verbose"
    under = memdiag("run", str(script), "-n", "2", "--out", str(out), "--", *target)
    assert under.returncode == 0, under.stdout + under.stderr

    def horovods(text: str) -> set[str]:
        return {c for c in CONVERTED.findall(text) if "horovod" in c.lower() or c.startswith("<function _")}

    # THEN autograph converted the same Horovod functions (the conversion is part of the job's first step:
    # about 4.5 s of a short-step script's), though memdiag's own wrappers stand between
    converted = horovods(plain.stdout)
    assert {"<function _allreduce_cond", "<function horovod_allreduce"} <= converted
    assert horovods((out / "mpirun.log").read_text()) == converted
