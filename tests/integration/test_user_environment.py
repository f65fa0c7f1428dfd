"""memdiag installed with pip into an environment that already has TensorFlow and Horovod, without
rebuilding them: a wheel of the checkout, installed offline into a virtualenv that sees the set-up's
packages as its own (a `.pth` file: the user's existing TensorFlow, Horovod, mpi4py, memray), then
`memdiag doctor` and a real run of a script from that environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def _run(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(args), capture_output=True, text=True, cwd=cwd, timeout=timeout, env={**env, "COLUMNS": "160"},
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def user_env(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("user-env")
    # GIVEN a wheel of memdiag (built from a copy: a build writes into the tree it builds), and an
    # environment whose TensorFlow and Horovod are already installed
    source = work / "memdiag-src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv*", ".git", "runs", "build", "*.egg-info", "__pycache__",
                                                                 ".*_cache", ".hypothesis", "_memdiag_mark.*"))
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
                 str(source), cwd=work)
    assert built.returncode == 0, built.stderr
    [wheel] = (work / "dist").glob("memdiag-*.whl")
    env = work / "env"
    assert _run(sys.executable, "-m", "venv", str(env), cwd=work).returncode == 0
    python = env / "bin" / "python"
    site = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=work).stdout.strip()
    Path(site, "existing-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # WHEN memdiag is installed into it with pip, offline: nothing may be downloaded or built
    installed = _run(str(python), "-m", "pip", "install", "-q", "--no-index", str(wheel), cwd=work)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return env


def test_memdiag_installs_into_an_existing_environment_without_touching_tensorflow_or_horovod(user_env):
    python = str(user_env / "bin" / "python")
    where = _run(python, "-c", "import memdiag, horovod, tensorflow as tf; "
                               "print(memdiag.__file__, horovod.__file__, tf.__file__)", cwd=user_env)
    memdiag_file, horovod_file, tf_file = where.stdout.split()
    # memdiag is the wheel's copy in the new environment; TensorFlow and Horovod are the existing ones
    assert memdiag_file.startswith(str(user_env)) and not memdiag_file.startswith(str(ROOT / "memdiag"))
    assert not horovod_file.startswith(str(user_env)) and not tf_file.startswith(str(user_env))
    listed = _run(python, "-m", "pip", "list", "--path", sysconfig.get_paths()["purelib"].replace(sys.prefix, str(user_env)),
                  "--format", "json", cwd=user_env)
    own = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "memdiag" in own and not own & {"tensorflow-cpu", "tensorflow", "horovod", "keras"}


def test_doctor_in_that_environment_passes_and_says_how_to_build_the_native_marks(user_env):
    doctor = _run(str(user_env / "bin" / "memdiag"), "doctor", "-n", "2", cwd=user_env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in doctor.stdout.splitlines()
            if line.startswith("│") and line.split("│")[1].strip()}
    assert rows["horovod"] == "ok" and rows["mpi match"] == "ok" and rows["tensorflow"] == "ok"
    # a wheel carries the native marks' source, not a library built for this TensorFlow
    assert rows["native marks"] == "warn" and "python -m memdiag.nativemarks build" in " ".join(doctor.stdout.split())
    assert "make setup" not in doctor.stdout  # no checkout to run it in


def test_a_script_runs_under_memdiag_from_that_environment(user_env, tmp_path):
    out = tmp_path / "run"
    done = _run(str(user_env / "bin" / "memdiag"), "run", str(ROOT / "examples" / "user_tape_function.py"), "-n", "2",
                "--out", str(out), "--", "--steps", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["status"] == "ok" and manifest["rank_status"] == {"0": "ok", "1": "ok"}
    starts = [json.loads(line) for rank in (0, 1) for line in (out / f"rank-{rank}.jsonl").read_text().splitlines()[:1]]
    assert [s["type"] for s in starts] == ["start", "start"]
    # without the native library the ranks mark through Python, and say why
    assert all(str(s.get("marks", "")).startswith("python") for s in starts), starts
