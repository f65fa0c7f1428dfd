"""Faults memdiag exists for: a rank killed for memory, a hang, a crash, a broken install."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import memdiag, read_json, read_records, undeclared_record_fields

pytestmark = pytest.mark.mpi


def agents_of(run_id: str) -> list[str]:
    # -ww: never cut a command line to the terminal width (the configuration is its last word)
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "memdiag.agent" in line and run_id in _decoded(line)]


def _decoded(line: str) -> str:
    import base64

    try:
        return base64.urlsafe_b64decode(line.split()[-1].encode()).decode()
    except Exception:  # noqa: BLE001 - not an agent command line
        return ""


def test_memory_limit_kills_the_rank_and_keeps_every_completed_step(runs_root, sparse_run):
    # GIVEN a limit above the set-up but below what the training steps need (measured by the same run
    # without a limit: tests/conftest.py; sparse is what `memdiag run` of a built-in workload does by default)
    probe, _ = sparse_run
    steps = [r for r in read_records(probe / "rank-0.jsonl") if r["type"] == "step"]
    setup_peak = steps[0]["peak_rss_bytes"]
    final_peak = max(s["peak_rss_bytes"] for s in steps)
    assert final_peak > setup_peak
    limit = (setup_peak + final_peak) // 2
    # WHEN the same run is made with that limit
    out = runs_root / "limited"
    result = memdiag("run", "transformer", "-n", "2", "--steps", "3", "--mem-limit", str(limit), "--out", str(out))
    # THEN it fails, names the killed rank, its step and the collective, and loses no completed step
    assert result.returncode == 1
    summary = read_json(out / "summary.json")
    failure = summary["failure"]
    assert failure["kind"] == "mem-limit" and "killed at step" in failure["headline"]
    killed = {int(k): v for k, v in failure["killed_ranks"].items()}
    for rank, record in killed.items():
        assert record["rss_bytes"] > limit == record["limit_bytes"]
        records = read_records(out / f"rank-{rank}.jsonl")
        completed = [r["step"] for r in records if r["type"] == "step"]
        assert completed == list(range(-1, record["step"]))
    assert "killed at step" in result.stdout
    assert any(r["status"] == "killed" for r in summary["ranks"])
    assert undeclared_record_fields(out) == {}  # the killed record's fields are declared


def test_a_script_rank_killed_outright_keeps_every_step_before_the_one_it_was_in(runs_root):
    # GIVEN a short-step script whose rank 1 kills itself outright (SIGKILL: no handler runs) before step 25,
    # its marks made records only every 10 s, so that none of its steps was drained when it died
    script = Path(__file__).with_name("killed_script.py")
    out = runs_root / "killed-outright"
    result = memdiag("run", str(script), "-n", "2", "--record-every", "10", "--out", str(out),
                     "--", "--steps", "60", "--die-at", "25", "--die-rank", "1")
    assert result.returncode != 0
    # THEN rank 1 has every step it completed before the one it was in (24: its end is the next step's
    # first collective), each once, made from the marks it left in its file
    killed = read_records(out / "rank-1.jsonl")
    assert [r["step"] for r in killed if r["type"] == "step"] == list(range(-1, 24))
    [made] = [r for r in killed if r["type"] == "replayed"]
    assert made["steps"][1] == 23 and made["marks"] > 0
    # AND the same collectives in each of those steps as rank 0, which was terminated and drained its own
    survivor = read_records(out / "rank-0.jsonl")

    def calls(records: list[dict]) -> dict[int, list[tuple]]:
        found: dict[int, list[tuple]] = {}
        for r in records:  # steps below 32 are written as one collective record per call
            if r["type"] == "collective" and 0 <= r["step"] < 24:
                found.setdefault(r["step"], []).append((r["op"], r["name"], r.get("part")))
        return {step: sorted(names) for step, names in found.items()}

    assert calls(killed) == calls(survivor) and len(calls(killed)) == 24
    # AND the summary and the report say which steps were made so, and the files are gone
    summary = read_json(out / "summary.json")
    [rank1] = [r for r in summary["ranks"] if r["rank"] == 1]
    assert rank1["replayed_steps"] == made["steps"] and rank1["status"] == "died"
    assert summary["failure"]["headline"].startswith("rank(s) 1 ended without a record of why")
    assert "made from the marks left by ranks killed outright: rank 1 steps" in " ".join(result.stdout.split())
    assert not list(out.glob("rank-*.marks.*"))
    assert undeclared_record_fields(out) == {}


HANG = """
import time
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
x = tf.ones([4])
for step in range(3):
    hvd.allreduce(x, name="grad_a")
if hvd.rank() != 1:
    hvd.allreduce(x, name="grad_b")
else:
    time.sleep(600)
"""


def test_a_hang_ends_at_the_timeout_naming_the_collective_and_the_missing_rank(runs_root, tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(HANG)
    out = runs_root / "hang"
    start = time.monotonic()
    result = memdiag("run", str(script), "-n", "2", "--timeout", "20", "--out", str(out))
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    manifest = read_json(out / "run.json")
    assert manifest["status"] == "timeout"
    failure = read_json(out / "summary.json")["failure"]
    assert failure["kind"] == "timeout" and failure["waiting_ranks"] == [0]
    assert "grad_b" in failure["headline"] and "rank(s) 1 never joined" in failure["headline"]
    assert "hang:" in result.stdout
    assert agents_of(manifest["run_id"]) == []  # no orphan rank left behind


def test_a_rank_that_dies_is_reported_with_its_last_step(runs_root, tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, horovod.tensorflow as hvd, tensorflow as tf\nhvd.init()\n"
        "for step in range(4):\n    hvd.allreduce(tf.ones([8]), name='g')\n"
        "    if step == 2 and hvd.rank() == 1:\n        os._exit(9)\n"
    )
    out = runs_root / "dies"
    result = memdiag("run", str(script), "-n", "2", "--timeout", "60", "--out", str(out))
    assert result.returncode == 9  # the dead rank's exit status, as plain mpirun exits with it
    summary = read_json(out / "summary.json")
    rank1 = summary["ranks"][1]
    assert rank1["status"] == "died" and rank1["last_step"] == 1


def test_horovod_without_tensorflow_support_is_one_line_and_leaves_no_run(tmp_path):
    # GIVEN an installation whose Horovod was built without its TensorFlow extension
    stub = tmp_path / "site" / "horovod" / "tensorflow"
    stub.mkdir(parents=True)
    (stub.parent / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (stub / "__init__.py").write_text("raise ImportError('Extension horovod.tensorflow has not been built')\n")
    out = tmp_path / "run"
    import os

    env_before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(tmp_path / "site")
    try:
        result = memdiag("run", "transformer", "-n", "2", "--out", str(out))
    finally:
        if env_before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = env_before
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("memdiag: error:")]
    assert len(lines) == 1 and "has not been built" in lines[0] and "make setup" in lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists()


# The extended tier (a run and a comparison, about 35 s on 2 cores): the core tier's memory-limit tests
# kill a rank at its limit and keep its steps; this one is the comparison's headline under a limit.
@pytest.mark.slow
def test_a_limit_between_the_dense_and_the_sparse_peak_kills_only_sparse(runs_root):
    # GIVEN a user's script whose table is small (1000 x 256) and whose lookups are many (100,000 ids per
    # rank per step): sparse gathers 2 x 100,000 rows of 1 KiB at N=2, about 195 MiB and as much again
    # for Horovod's average, where dense all-reduces 1000 KiB. Its dense peak, and a limit 200 MiB above
    # it, halfway to what the gathered rows add (about 400 MiB measured on a 2-core, 24 GiB machine)
    from tests.helpers import ROOT

    script = [str(ROOT / "examples" / "user_repetitive_lookups.py")]
    script_args = ["--", "--vocab", "1000", "--width", "256", "--tokens", "100000", "--steps", "2"]
    dense = runs_root / "limit-dense-n2"
    assert memdiag("run", *script, "-n", "2", "--mode", "dense", "--out", str(dense), *script_args).returncode == 0
    limit = read_json(dense / "summary.json")["peak_rss_bytes_max"] + 200 * 2**20
    # WHEN sparse and dense are compared under that limit
    out = runs_root / "limit-compare-n2"
    result = memdiag("compare", "sparse-vs-dense", *script, "-n", "2", "--modes", "sparse,dense",
                     "--mem-limit", str(limit), "--out", str(out), *script_args)
    # THEN dense completes, sparse is killed, and that is the headline
    data = read_json(out / "compare.json")
    status = {r["mode"]: r["status"] for r in data["rows"]}
    assert status == {"dense": "ok", "sparse": "failed"}
    assert data["headline"].startswith("killed by the memory limit: sparse at N=2")
    assert "Completed under the same limit: dense at N=2" in data["headline"]
    assert "allgather" in data["headline"]
    assert "headline" in result.stdout and result.returncode == 1


def test_terminating_memdiag_ends_mpirun_and_every_rank(runs_root, tmp_path):
    # GIVEN a run in progress (a script that trains slowly)
    import os
    import signal
    import sys

    from tests.helpers import ROOT

    script = tmp_path / "slow.py"
    script.write_text("import time, horovod.tensorflow as hvd, tensorflow as tf\nhvd.init()\n"
                      "for step in range(600):\n    hvd.allreduce(tf.ones([8]), name='g')\n    time.sleep(0.1)\n")
    out = runs_root / "terminated"
    proc = subprocess.Popen([sys.executable, "-m", "memdiag", "run", str(script), "-n", "2", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "rank-1.jsonl").exists():
        time.sleep(0.5)
    run_id = read_json(out / "run.json")["run_id"]
    while time.monotonic() < deadline and len(agents_of(run_id)) < 2:
        time.sleep(0.5)
    assert len(agents_of(run_id)) >= 2, "the ranks should be running"
    # WHEN memdiag is terminated, as a batch system or `kill` does
    os.kill(proc.pid, signal.SIGTERM)
    stderr = proc.communicate(timeout=60)[1]
    # THEN it exits as terminated, without a traceback, and leaves no rank behind
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in stderr
    for _ in range(20):
        if not agents_of(run_id):
            break
        time.sleep(0.5)
    assert agents_of(run_id) == []
