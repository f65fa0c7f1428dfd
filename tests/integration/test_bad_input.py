"""Bad input: one line that says what to do, exit status 2, no traceback, no run directory left."""

from __future__ import annotations

import os
import sys

import pytest

from tests.helpers import ROOT, memdiag


def assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args,needles", [
    (["run", "transfromer", "-n", "2"], ["unknown workload 'transfromer'", "transformer"]),
    (["watch", "no-such-run"], ["not a memdiag run directory", "--out of memdiag run or memdiag agent"]),
    (["watch", ".", "--interval", "0"], ["--interval must be a positive number"]),
    (["run", "missing_script.py", "-n", "2"], ["missing_script.py not found"]),
    (["run", "transformer", "-n", "0"], ["-n must be at least 1"]),
    (["run", "transformer", "-n", "-3"], ["-n must be at least 1"]),
    (["run", "transformer", "-n", "four"], ["-n must be a whole number"]),
    (["run", "transformer", "-n", "2", "--steps", "0"], ["--steps must be at least 1"]),
    (["run", "transformer", "-n", "2", "--mode", "dnese"], ["mode must be one of as-written, sparse, dense, auto"]),
    (["run", "transformer", "-n", "2", "--preset", "huge"], ["no preset 'huge'", "tiny"]),
    (["run", "transformer", "-n", "2", "--set", "vocab=3"], ["unknown setting"]),
    (["run", "resnet50", "-n", "2", "--engine", "tf-distribute"], ["transformer, mixed", "not resnet50",
                                                                    "--engine horovod"]),
    (["run", "transfromer", "-n", "2", "--engine", "tf-distribute"], ["unknown workload 'transfromer'"]),
    (["run", "train.py", "-n", "2", "--engine", "tf-distribute", "--mode", "dedup"], ["as-written, sparse, dense"]),
    (["run", "transformer", "-n", "2", "--engine", "tf-distribute", "--mode", "dedup"], ["not dedup"]),
    (["run", "mixed", "-n", "2", "--engine", "tf-distribute", "--hosts", "a:x"], ["--hosts a:x", "e.g. a:4"]),
    (["run", "transformer", "-n", "2", "--engine", "tf-distribute", "--horovod-timeline"], ["needs --engine horovod"]),
    (["run", "transformer", "-n", "2", "--engine", "nccl"], ["--engine", "tf-distribute"]),
    (["compare", "sparse-vs-dense", "transformer", "-n", "1,x"], ["rank counts must be whole numbers"]),
    (["compare", "sparse-vs-dense", "transformer", "--modes", "sparse,fast"], ["--modes"]),
    (["predict", "/nonexistent-run", "--ranks", "8"], ["not a directory"]),
    (["report", str(ROOT)], ["not a memdiag run"]),
])
def test_bad_arguments(args, needles, tmp_path):
    result = memdiag(*args, cwd=tmp_path)
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "runs").exists()  # nothing that looks like a run was left behind


def test_existing_run_directory_is_refused_without_force(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    result = memdiag("run", "transformer", "-n", "1", "--out", str(out))
    assert_one_line_error(result, "already exists", "--force")
    assert (out / "run.json").read_text() == "{}"


def test_unwritable_output_directory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = memdiag("run", "transformer", "-n", "1", "--out", str(blocker / "run"))
    assert_one_line_error(result, "cannot write to --out")


def test_mpirun_missing(tmp_path):
    env_path = os.environ["PATH"]
    try:
        os.environ["PATH"] = str(tmp_path)  # no mpirun here
        result = memdiag("run", "transformer", "-n", "1", "--out", str(tmp_path / "r"))
    finally:
        os.environ["PATH"] = env_path
    assert_one_line_error(result, "mpirun not found")
    assert not (tmp_path / "r").exists()


def test_report_of_a_damaged_manifest(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    assert_one_line_error(memdiag("report", str(tmp_path)), "not valid JSON")


def test_help_works():
    result = memdiag("--help")
    assert result.returncode == 0 and "compare" in result.stdout and "predict" in result.stdout
    assert sys.executable
