"""`memdiag agent` under the user's own mpirun (with the user's flags), against `memdiag run` of the same
script: the same collectives, the same bytes, a run directory that `report` reads; and its bad input.

The Slurm launchers (srun, sbatch, salloc, horovodrun) are the Slurm tier's: tests/slurm/.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import PYTHON, ROOT, memdiag, read_json, read_records, undeclared_record_fields
from tests.launchers import MARKER_SCRIPT, collective_signature, end_records, memdiag_agent_argv

SCRIPT = "examples/user_tape_function.py"
STEPS = "3"

# What the script reduces at each training step on each of 2 ranks, from its defaults (vocab 1000,
# width 32, 256 tokens per rank per step) and its layers "words", "hidden" and "head" (Keras 2 names a
# layer's variables "layer/variable:0"): the embedding's IndexedSlices gradient gathered as values
# (256 rows of 32 float32) and indices (256 int64: the script's numpy ids, which Keras keeps), and the
# four dense gradients allreduced. (op, name, part, shape_in, shape_out, bytes_out)
WIDTH, TOKENS = 32, 256
GRADIENT_COLLECTIVES = sorted([
    ("allgather", "words/embeddings:0", "values", [TOKENS, WIDTH], [2 * TOKENS, WIDTH], 2 * TOKENS * WIDTH * 4),
    ("allgather", "words/embeddings:0", "indices", [TOKENS], [2 * TOKENS], 2 * TOKENS * 8),
    ("allreduce", "hidden/kernel:0", None, [WIDTH, WIDTH], [WIDTH, WIDTH], WIDTH * WIDTH * 4),
    ("allreduce", "hidden/bias:0", None, [WIDTH], [WIDTH], WIDTH * 4),
    ("allreduce", "head/kernel:0", None, [WIDTH, 4], [WIDTH, 4], WIDTH * 4 * 4),
    ("allreduce", "head/bias:0", None, [4], [4], 4 * 4),
], key=str)
GATHERED_PER_STEP = 2 * TOKENS * (WIDTH * 4 + 8)  # 69,632 B received per rank per step
REDUCED_PER_STEP = (WIDTH * WIDTH + WIDTH + WIDTH * 4 + 4) * 4  # 4,752 B
VARIABLES = {"words/embeddings:0", "hidden/kernel:0", "hidden/bias:0", "head/kernel:0", "head/bias:0"}


def assert_recorded_the_scripts_steps(run_dir: Path) -> None:
    """Each of the 2 ranks' own records (read as written, not by memdiag's reader): it started as its rank of
    2, recorded the set-up and steps 0, 1, 2, reduced the script's gradients at each step, broadcast the
    variables after the first step only (as the script does), and ended ok."""
    for rank in (0, 1):
        records = read_records(run_dir / f"rank-{rank}.jsonl")
        [start] = [r for r in records if r["type"] == "start"]
        assert (start["rank"], start["size"]) == (rank, 2)
        assert [r["step"] for r in records if r["type"] == "step"] == [-1, 0, 1, 2], f"rank {rank}"
        collectives = [r for r in records if r["type"] == "collective"]
        for step in range(int(STEPS)):
            gradients = sorted(((c["op"], c["name"], c["part"], c["shape_in"], c["shape_out"], c["bytes_out"])
                                for c in collectives if c["step"] == step and c.get("gradient")), key=str)
            assert gradients == GRADIENT_COLLECTIVES, f"rank {rank} step {step}"
        broadcast: dict[int, set[str]] = {}
        for c in collectives:
            if c["op"] == "broadcast":
                broadcast.setdefault(c["step"], set()).add(c["name"])
        assert set(broadcast) == {0} and broadcast[0] >= VARIABLES, f"rank {rank}: {broadcast}"
        [end] = [r for r in records if r["type"] == "end"]
        assert end["status"] == "ok" and end["error"] is None


@pytest.fixture(scope="module")
def reference(runs_root):
    out = runs_root / "ref-memdiag-run"
    result = memdiag("run", SCRIPT, "-n", "2", "--out", str(out), "--", "--steps", STEPS)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def user_mpirun(runs_root):
    """The user's own mpirun, with their own flags, starting `memdiag agent` on every rank."""
    out = runs_root / "agent-mpirun"
    mpirun = shutil.which("mpirun")
    assert mpirun is not None
    cmd = [mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none", "--map-by", "slot", "--tag-output",
           *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           *memdiag_agent_argv("--out", str(out), "--", "python", SCRIPT, "--steps", STEPS)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)
    return out, result


@pytest.mark.mpi
def test_agent_under_the_users_mpirun_records_the_same_collectives_as_memdiag_run(reference, user_mpirun):
    # GIVEN the script run by `memdiag run -n 2` and by the user's mpirun -np 2 starting `memdiag agent`
    out, result = user_mpirun
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # THEN each rank of each recorded the script's 3 steps and, at each, the collectives the script makes
    assert_recorded_the_scripts_steps(reference)
    assert_recorded_the_scripts_steps(out)
    # AND the two record every collective alike, step by step (times aside)
    for rank in (0, 1):
        mine, theirs = collective_signature(out, rank), collective_signature(reference, rank)
        assert mine and mine == theirs, f"rank {rank}"
    # AND both summaries give each rank the bytes the script gathers and reduces per step
    for run_dir in (out, reference):
        ranks = read_json(run_dir / "summary.json")["ranks"]
        assert [(r["rank"], r["status"], r["steps_completed"]) for r in ranks] == [(0, "ok", 3), (1, "ok", 3)]
        assert [r["allgather_bytes_per_step"] for r in ranks] == [GATHERED_PER_STEP] * 2, run_dir
        assert [r["allreduce_bytes_per_step"] for r in ranks] == [REDUCED_PER_STEP] * 2, run_dir


@pytest.mark.mpi
def test_agent_run_json_names_the_launcher_its_command_and_every_ranks_exit(user_mpirun):
    import socket

    # GIVEN the run directory the agents wrote under the user's mpirun (-np 2 --map-by slot --tag-output)
    out, _ = user_mpirun
    manifest = read_json(out / "run.json")
    # THEN run.json names mpirun as the launcher, and the run and each rank ok, each rank's exit status 0
    assert manifest["launcher"] == "mpirun" and manifest["status"] == "ok"
    assert manifest["rank_status"] == {"0": "ok", "1": "ok"} and manifest["rank_exit_codes"] == {"0": 0, "1": 0}
    # AND its command is rank 0's parent: the user's mpirun, with the user's own flags in the user's order
    command = manifest["command"]
    assert os.path.basename(command[0]) == "mpirun" and command[command.index("-np") + 1] == "2"
    assert command[command.index("--map-by") + 1] == "slot" and "--tag-output" in command
    assert manifest["world_size"] == 2 and manifest["script"].endswith(SCRIPT)
    assert manifest["user_command"] == ["python", SCRIPT, "--steps", STEPS]
    # AND each rank stopped at the script's last step (2 of 0-2), both on this host, which is the one host
    assert manifest["rank_stopped_at_step"] == {"0": int(STEPS) - 1, "1": int(STEPS) - 1}
    assert manifest["placement"] == [socket.gethostname()] * 2 and manifest["hosts"] is None
    assert manifest["versions"]["horovod"] and manifest["versions"]["tensorflow"]
    # AND every rank checked in with this run's id and left its exit status beside it
    agents = out / ".memdiag-agents"
    for rank in (0, 1):
        start, end = read_json(agents / f"rank-{rank}.start.json"), read_json(agents / f"rank-{rank}.end.json")
        assert start["run_id"] == end["run_id"] == manifest["run_id"] and start["rank"] == end["rank"] == rank
        assert end["exit_code"] == 0


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def assert_shows(cell: str, n: int) -> None:
    """``cell`` shows ``n`` bytes, to the 3 significant figures the reports give."""
    number, unit = cell.split()
    assert abs(float(number) * UNITS[unit] - n) <= 0.005 * n, f"{cell!r} is not {n} B"


@pytest.mark.mpi
def test_report_reads_an_agent_run_directory(user_mpirun):
    # GIVEN the run directory the agents wrote under the user's mpirun
    out, _ = user_mpirun
    # WHEN `memdiag report` reads it, as text and as JSON (the summary recomputed from the records)
    result = memdiag("report", str(out))
    as_json = memdiag("report", str(out), "--format", "json")
    assert result.returncode == 0 and as_json.returncode == 0, result.stderr + as_json.stderr
    # THEN the text names the script's run: 2 ranks, 3 steps, as written, ok
    flat = " ".join(result.stdout.split())
    assert "user_tape_function" in flat and "mode as-written ranks 2 steps 3 status ok" in flat
    assert "measured as written: memdiag changed nothing in the job" in flat
    # AND one row per rank, ok, with the bytes the script gathers and reduces per step
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")] if line.startswith("│") else []
        if cells and cells[0] in ("0", "1"):
            rows[cells[0]] = cells
    assert sorted(rows) == ["0", "1"]
    for cells in rows.values():
        status, _peak, _hwm, gathered, reduced = cells[1:6]
        assert status == "ok"
        assert_shows(gathered, GATHERED_PER_STEP)
        assert_shows(reduced, REDUCED_PER_STEP)
    # AND the tensor table names the embedding's gathered values and indices, 256 rows in, 512 out
    assert "words/embeddings [values]" in flat and "words/embeddings [indices]" in flat
    assert flat.count(f"{TOKENS}>{2 * TOKENS}") == 2
    # AND the recomputed summary has what the agents' summary.json has, and the records say
    summary, written = json.loads(as_json.stdout), read_json(out / "summary.json")
    assert (summary["world_size"], summary["status"], summary["steps_recorded"]) == (2, "ok", 3)
    figures = ("rank", "status", "steps_completed", "allgather_bytes_per_step", "allreduce_bytes_per_step")
    assert [{k: r[k] for k in figures} for r in summary["ranks"]] == \
        [{k: r[k] for k in figures} for r in written["ranks"]] == \
        [{"rank": r, "status": "ok", "steps_completed": 3, "allgather_bytes_per_step": GATHERED_PER_STEP,
          "allreduce_bytes_per_step": REDUCED_PER_STEP} for r in (0, 1)]


# -- bad input: one line, exit status 2, the user's script not started --------------------------------

ONE_RANK = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "PMIX_RANK": "0", "PMIX_NAMESPACE": "t1"}


def _agent(env: dict[str, str], *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    launcher = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_", "HOROVOD_"))}
    marker = tmp_path / "started"
    return subprocess.run(memdiag_agent_argv(*args, "--", "python", str(MARKER_SCRIPT), str(marker)),
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**launcher, **env}, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("env,out,needle", [
    ({}, "fresh", "no launcher's environment"),
    ({**ONE_RANK, "PMIX_RANK": "1"}, "fresh", "OMPI_COMM_WORLD_RANK=0 but PMIX_RANK=1"),
    (ONE_RANK, "a-file/run", "cannot write to --out"),
    (ONE_RANK, "another-run", "already exists"),
    # rank 0 of 2, alone: rank 1 never checks in
    ({**ONE_RANK, "OMPI_COMM_WORLD_SIZE": "2"}, "fresh", "rank(s) 1 did not check in"),
    # rank 1 of 2, alone: no rank 0 creates the run directory
    ({**ONE_RANK, "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "PMIX_RANK": "1"}, "fresh",
     "rank 0 did not create"),
])
def test_bad_input_is_one_line_exit_2_and_the_script_never_starts(tmp_path, env, out, needle):
    (tmp_path / "a-file").write_text("")
    (tmp_path / "another-run").mkdir()
    (tmp_path / "another-run" / "run.json").write_text('{"run_id": "0123456789ab"}')
    result = _agent(env, "--out", str(tmp_path / out), "--start-timeout", "2", tmp_path=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "started").exists()
    if out == "fresh":
        assert not (tmp_path / "fresh").exists()  # nothing that looks like a run is left behind


def test_ranks_named_for_memray_must_exist(tmp_path):
    result = _agent({**ONE_RANK, "OMPI_COMM_WORLD_SIZE": "2"}, "--out", str(tmp_path / "m"), "--memray-ranks", "0,7",
                    tmp_path=tmp_path)
    assert result.returncode == 2 and "--memray-ranks names rank 7" in result.stderr
    assert not (tmp_path / "started").exists()


def test_the_marker_script_does_start_when_nothing_is_wrong(tmp_path):
    """The marker proves the bad-input tests above: the same script, run plainly, leaves it."""
    marker = tmp_path / "started"
    subprocess.run([PYTHON, str(MARKER_SCRIPT), str(marker)], check=True, timeout=60)
    assert marker.exists()


# -- memdiag run --launcher: bad input ------------------------------------------------------------------

def _memdiag_outside_slurm(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([PYTHON, "-m", "memdiag", *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args,needle", [
    (["run", "transformer"], "give the number of ranks with -n N"),
    (["run", "transformer", "-n", "2", "--launcher", "srun", "--hosts", "a:2"], "--hosts is mpirun's host list"),
    (["run", "transformer", "-n", "2", "--launcher", "pbs"], "--launcher"),
])
def test_run_launcher_bad_input(tmp_path, args, needle):
    result = _memdiag_outside_slurm(*args, "--out", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], result.stderr
    assert not (tmp_path / "r").exists()


def test_run_launcher_srun_without_srun(tmp_path):
    result = _memdiag_outside_slurm("run", "transformer", "-n", "1", "--launcher", "srun", "--out", str(tmp_path / "r"),
                                    path=str(tmp_path))
    assert result.returncode == 2 and "srun not found" in result.stderr
    assert not (tmp_path / "r").exists()


# -- ended from outside: SIGTERM, SIGKILL --------------------------------------------------------------

def _steps_recorded(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text(errors="replace").splitlines()
               if line.startswith('{"type":"step"') and '"step":-1' not in line)


def _start_long_run(out: Path, *options: str) -> subprocess.Popen:
    """`memdiag run` of the example for ever (100000 steps), once both ranks have finished 2 steps."""
    proc = subprocess.Popen([PYTHON, "-m", "memdiag", "run", SCRIPT, "-n", "2", "--out", str(out), *options, "--",
                             "--steps", "100000"], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 400
    while min(_steps_recorded(out / "rank-0.jsonl"), _steps_recorded(out / "rank-1.jsonl")) < 2:
        assert proc.poll() is None, proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        assert time.monotonic() < deadline, "the run did not reach step 2"
        time.sleep(0.5)
    return proc


def _last_step(path: Path) -> int:
    """The largest training step any record of a rank file names (read here, not by memdiag)."""
    steps = [r.get("step") for r in read_records(path)]
    return max(s for s in steps if isinstance(s, int) and s >= 0)


@pytest.mark.mpi
def test_sigterm_to_memdiag_run_lets_every_rank_write_and_marks_the_run_terminated(runs_root):
    out = runs_root / "sigterm"
    proc = _start_long_run(out)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    manifest = read_json(out / "run.json")
    assert manifest["status"].startswith("terminated by SIGTERM at step"), manifest["status"]
    for rank in (0, 1):
        [end] = end_records(out, rank)
        assert end["status"] == "terminated" and end["signal"] == "SIGTERM" and end["step"] >= 1
        assert manifest["rank_stopped_at_step"][str(rank)] == _last_step(out / f"rank-{rank}.jsonl")
    assert read_json(out / "summary.json")["status"] == manifest["status"]
    assert undeclared_record_fields(out) == {}  # the terminated and end records' fields are declared
    report = memdiag("report", str(out))
    assert report.returncode == 0 and "terminated by SIGTERM at step" in report.stdout


@pytest.mark.mpi
def test_sigterm_under_record_every_still_writes_every_step_before_the_one_in_progress(runs_root):
    # GIVEN a run whose marks become records only every 10 s (--record-every), past its first steps
    out = runs_root / "sigterm-record-every"
    proc = _start_long_run(out, "--record-every", "10")
    time.sleep(3)  # steps run whose marks wait in the ring
    # WHEN it is terminated
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    # THEN each rank read its marks before it wrote where it was: every step before that one has its record
    for rank in (0, 1):
        [end] = end_records(out, rank)
        steps = sorted(r["step"] for r in read_records(out / f"rank-{rank}.jsonl")
                       if r["type"] == "step" and r["step"] >= 0)
        assert end["step"] >= 3 and steps == list(range(end["step"])), (end["step"], steps)


@pytest.mark.mpi
def test_after_sigkill_collect_says_the_run_ended_without_a_word_and_where_each_rank_stopped(runs_root):
    import psutil

    out = runs_root / "sigkill"
    proc = _start_long_run(out)
    # A batch system's SIGKILL reaches every process of the job at once: memdiag, mpirun, the ranks.
    everyone = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for process in everyone:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    psutil.wait_procs(everyone, timeout=60)
    proc.wait(timeout=60)
    assert read_json(out / "run.json")["status"] == "running"  # nobody was left to say otherwise
    # report, before anyone collects, says what collect will mark, and leaves the directory as it is
    before = memdiag("report", str(out))
    assert before.returncode == 0 and "ended without a word from its launcher" in before.stdout, before.stdout
    assert "memdiag collect" in before.stderr
    assert read_json(out / "run.json")["status"] == "running"
    result = memdiag("collect", str(out))
    assert result.returncode == 0, result.stderr
    manifest = read_json(out / "run.json")
    assert manifest["status"].startswith("ended without a word from its launcher"), manifest["status"]
    for rank in (0, 1):
        last = _last_step(out / f"rank-{rank}.jsonl")
        assert manifest["rank_stopped_at_step"][str(rank)] == last
        assert f"stopped at step {last}" in manifest["status"]
        assert manifest["rank_status"][str(rank)] == "died"
    report = memdiag("report", str(out))
    assert report.returncode == 0 and "ended without a word from its launcher" in report.stdout


# -- heavy tracing on some ranks only ---------------------------------------------------------------------

def _median_gap(path: Path) -> float:
    import statistics

    gaps = [b - a for r in read_records(path) if r["type"] == "mem" and isinstance(r.get("times"), list)
            for a, b in zip(r["times"], r["times"][1:])]
    return statistics.median(gaps)


# The options name ranks; what the script trains does not matter to them. A script that only keeps its
# core busy for a second gives the sampler as much to do, without memray tracing Keras, a model and a
# graph's tracing (65 s of the test became 26 s on 2 cores); the agent still imports Horovod under memray.
BUSY_SCRIPT = "import time\nstart = time.monotonic()\nwhile time.monotonic() - start < 1.0:\n    pass\n"


# The extended tier, with the other memray tests (about 23 s on 2 cores: memray's native tracking)
@pytest.mark.mpi
@pytest.mark.slow
def test_memray_and_fine_sampling_only_on_the_ranks_named(runs_root, tmp_path):
    out = runs_root / "some-ranks"
    script = tmp_path / "busy.py"
    script.write_text(BUSY_SCRIPT)
    mpirun = shutil.which("mpirun")
    assert mpirun is not None
    cmd = [mpirun, "-np", "2", "--oversubscribe", "--bind-to", "none",
           *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
           *memdiag_agent_argv("--out", str(out), "--memray-ranks", "1", "--trace-ranks", "0", "--", "python",
                               str(script))]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / "rank-1.memray.bin").exists() and not (out / "rank-0.memray.bin").exists()
    manifest = read_json(out / "run.json")
    assert manifest["memray_ranks"] == [1] and manifest["trace_ranks"] == [0]
    # rank 0 samples every 5 ms (a loaded host stretches that), rank 1 every 100 ms
    assert _median_gap(out / "rank-1.jsonl") >= 0.09 > _median_gap(out / "rank-0.jsonl")


# -- --launcher srun reaches every run of a comparison, and the srun command ------------------------------

def test_compare_launcher_srun_reaches_every_run():
    from memdiag.cli import build_parser
    from memdiag.launch.options import LaunchOptions
    from memdiag.launch.studies import CompareRequest

    args = build_parser().parse_args(["compare", "sparse-vs-dense", "transformer", "-n", "1,2", "--launcher", "srun"])
    request = CompareRequest("transformer", [1, 2], ["sparse", "dense"], LaunchOptions.from_args(args, []))
    assert request.run_request(2, "dense", "out").options.launcher == "srun"
    assert request.check_request(2, "out").options.launcher == "srun"


def test_the_srun_command_asks_for_pmix_and_overcommits_only_past_the_allocation(tmp_path, monkeypatch):
    from memdiag.launch import mpirun

    fake = tmp_path / "srun"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_MPI_TYPE", raising=False)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    inside = mpirun.command(mpirun.Launch(2, ["CONFIG"], launcher="srun"))
    assert inside[:3] == [str(fake), "-n", "2"] and "--mpi=pmix" in inside and "--overcommit" not in inside
    assert inside[-3:] == ["-m", "memdiag.agent", "CONFIG"] and "--kill-on-bad-exit=1" in inside
    assert "--overcommit" in mpirun.command(mpirun.Launch(4, ["CONFIG"], launcher="srun"))
    monkeypatch.setenv("SLURM_MPI_TYPE", "pmi2")  # the user's choice of MPI plugin is srun's to read
    assert "--mpi=pmix" not in mpirun.command(mpirun.Launch(2, ["CONFIG"], launcher="srun"))
