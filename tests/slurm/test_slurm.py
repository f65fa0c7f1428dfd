"""The Slurm tier (`make test-slurm`): memdiag inside a real one-node Slurm cluster (scripts/slurm_local.sh).

- sbatch of a job script that runs `srun --mpi=pmix memdiag agent ... -- python examples/...`;
- sbatch of a job script that runs `memdiag run --launcher srun` (-n from the allocation);
- a built-in workload through the user's mpirun inside salloc (`salloc mpirun memdiag agent transformer`);
- `horovodrun -np 2 memdiag agent ...`;
- scancel of a running job: every rank named with the step it was at.

Each run directory must hold the same collective records (op, tensor, part, shapes, bytes, per step)
as `memdiag run` of the same script or workload, and `memdiag report` must read it. Runs are shared
between tests (module fixtures) and small (3 steps of a small example, the tiny Transformer), to keep
the tier at a few minutes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import PYTHON, ROOT, memdiag, read_json
from tests.launchers import collective_signature, end_records, memdiag_agent_argv

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.timeout(900)]

SCRIPT = "examples/user_tape_function.py"
STEPS = "3"
WORKLOAD = ("transformer", "--preset", "tiny", "--steps", "2")


def _quoted(words: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(w) for w in words)


def _sbatch(tmp: Path, name: str, body: list[str], wait: bool = True) -> subprocess.CompletedProcess:
    script = tmp / f"{name}.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -n 2\n#SBATCH -J memdiag-" + name + "\n"
                      f"cd {ROOT}\n" + "\n".join(body) + "\n")
    args = ["sbatch", "-o", str(tmp / f"{name}.out"), *(["--wait"] if wait else ["--parsable"]), str(script)]
    return subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)


def _job_output(tmp: Path, name: str) -> str:
    path = tmp / f"{name}.out"
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no job output)"


def _same_collectives(run_dir: Path, reference: Path, ranks: int = 2) -> None:
    for rank in range(ranks):
        mine, theirs = collective_signature(run_dir, rank), collective_signature(reference, rank)
        assert mine, f"rank {rank} recorded no collectives in {run_dir}"
        assert mine == theirs, f"rank {rank}: {len(mine)} collectives against memdiag run's {len(theirs)}"
    ours, ref = read_json(run_dir / "summary.json"), read_json(reference / "summary.json")
    for key in ("allgather_bytes_per_step", "allreduce_bytes_per_step"):
        assert [r[key] for r in ours["ranks"]] == [r[key] for r in ref["ranks"]], key


def _report_works(run_dir: Path) -> None:
    result = memdiag("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert "status ok" in result.stdout


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slurm")


@pytest.fixture(scope="module")
def script_reference(tmp):
    out = tmp / "ref-script"
    result = memdiag("run", SCRIPT, "-n", "2", "--out", str(out), "--", "--steps", STEPS)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def workload_reference(tmp):
    out = tmp / "ref-workload"
    result = memdiag("run", *WORKLOAD, "-n", "2", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def sbatch_srun_agent(slurm_cluster, tmp):
    out = tmp / "sbatch-srun-agent"
    srun = ["srun", "--mpi=pmix", "-n", "2",
            *memdiag_agent_argv("--out", str(out), "--", "python", SCRIPT, "--steps", STEPS)]
    return out, _sbatch(tmp, "srun-agent", [_quoted(srun)])


@pytest.fixture(scope="module")
def sbatch_memdiag_run(slurm_cluster, tmp):
    out = tmp / "sbatch-memdiag-run"
    run = [PYTHON, "-m", "memdiag", "run", SCRIPT, "--launcher", "srun", "--out", str(out), "--", "--steps", STEPS]
    return out, _sbatch(tmp, "memdiag-run", [_quoted(run)])


@pytest.fixture(scope="module")
def salloc_mpirun_agent(slurm_cluster, tmp):
    out = tmp / "salloc-mpirun-agent"
    mpirun = shutil.which("mpirun")
    assert mpirun is not None
    cmd = ["salloc", "-n", "2", mpirun, "-np", "2", "--bind-to", "none",
           *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           *memdiag_agent_argv(*WORKLOAD, "--out", str(out))]
    return out, subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def horovodrun_agent(tmp):
    out = tmp / "horovodrun-agent"
    horovodrun = Path(PYTHON).parent / "horovodrun"
    cmd = [str(horovodrun), "-np", "2", *memdiag_agent_argv("--out", str(out), "--", "python", SCRIPT, "--steps", STEPS)]
    env = {**os.environ, "PATH": f"{Path(PYTHON).parent}:{os.environ['PATH']}"}
    return out, subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
                               stdin=subprocess.DEVNULL)


def test_sbatch_srun_memdiag_agent(sbatch_srun_agent, script_reference, tmp):
    out, result = sbatch_srun_agent
    assert result.returncode == 0, result.stderr + _job_output(tmp, "srun-agent")
    manifest = read_json(out / "run.json")
    assert manifest["launcher"] == "srun" and manifest["status"] == "ok"
    assert manifest["allocation"]["batch"] is True and manifest["rank_exit_codes"] == {"0": 0, "1": 0}
    assert manifest["launcher_env"]["launcher"] == "slurm"
    _same_collectives(out, script_reference)
    _report_works(out)


def test_sbatch_memdiag_run_launcher_srun(sbatch_memdiag_run, script_reference, tmp):
    out, result = sbatch_memdiag_run
    assert result.returncode == 0, result.stderr + _job_output(tmp, "memdiag-run")
    manifest = read_json(out / "run.json")
    # -n came from the allocation (SLURM_NTASKS), and srun started the ranks
    assert manifest["world_size"] == 2 and manifest["launcher"] == "srun" and manifest["status"] == "ok"
    assert os.path.basename(manifest["command"][0]) == "srun" and "--mpi=pmix" in manifest["command"]
    _same_collectives(out, script_reference)
    _report_works(out)


def test_salloc_mpirun_memdiag_agent_builtin_workload(salloc_mpirun_agent, workload_reference):
    out, result = salloc_mpirun_agent
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = read_json(out / "run.json")
    assert manifest["launcher"] == "mpirun" and manifest["status"] == "ok"
    assert manifest["allocation"]["batch"] is False and manifest["workload"] == "transformer"
    _same_collectives(out, workload_reference)
    _report_works(out)


def test_horovodrun_memdiag_agent(horovodrun_agent, script_reference):
    out, result = horovodrun_agent
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    manifest = read_json(out / "run.json")
    assert manifest["launcher"] == "horovodrun" and manifest["status"] == "ok"
    # horovodrun replaced itself with its mpirun command, which is what rank 0's ancestors show
    assert os.path.basename(manifest["command"][0]) == "mpirun" and "NCCL_SOCKET_IFNAME=lo" in manifest["command"]
    _same_collectives(out, script_reference)
    _report_works(out)


def _steps_recorded(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text(errors="replace").splitlines()
               if line.startswith('{"type":"step"') and '"step":-1' not in line)


def _job_gone(job: str) -> bool:
    state = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30)
    return state.returncode != 0 or not state.stdout.strip()


def test_scancel_names_every_rank_with_its_last_step(slurm_cluster, tmp):
    out = tmp / "scancel"
    srun = ["srun", "--mpi=pmix", "-n", "2",
            *memdiag_agent_argv("--out", str(out), "--", "python", SCRIPT, "--steps", "100000")]
    submitted = _sbatch(tmp, "scancel", [_quoted(srun)], wait=False)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 400
    while _steps_recorded(out / "rank-1.jsonl") < 2:
        assert time.monotonic() < deadline, _job_output(tmp, "scancel")
        assert not _job_gone(job), _job_output(tmp, "scancel")
        time.sleep(0.5)
    subprocess.run(["scancel", job], check=True, timeout=30)
    while not _job_gone(job):
        assert time.monotonic() < deadline, "the job outlived scancel"
        time.sleep(0.5)
    manifest = read_json(out / "run.json")
    assert manifest["status"].startswith("terminated by SIGTERM at step"), manifest["status"]
    for rank in (0, 1):
        [end] = end_records(out, rank)
        assert end["status"] == "terminated" and end["signal"] == "SIGTERM"
        assert isinstance(end["step"], int) and end["step"] >= 1
        assert f"at step {end['step']}" in end["error"]
        assert manifest["rank_exit_codes"][str(rank)] in (143, -15)
    summary = read_json(out / "summary.json")
    assert summary["status"] == manifest["status"]
    report = memdiag("report", str(out))
    assert report.returncode == 0 and "terminated by SIGTERM at step" in report.stdout


def test_the_cluster_config_is_the_designed_one(slurm_cluster):
    config = Path(slurm_cluster).read_text()
    for line in ("SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "MpiDefault=none",
                 f"CPUs={len(os.sched_getaffinity(0))}"):
        assert line in config, line
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0 and "select/cons_tres" in shown.stdout
