"""``memdiag agent``: one rank of a job that the user's own launcher started (srun, mpirun, horovodrun).

Every rank runs ``memdiag agent --out DIR [options] -- python train.py ARGS``. This process finds its
place in the job from the launcher's environment (:mod:`memdiag.agent.launcher_env`), builds the same
:class:`memdiag.agentconfig.AgentConfig` that ``memdiag run`` would give the rank, and runs the same
agent (``python -m memdiag.agent CONFIG``, :mod:`memdiag.agent.main`) as its child, which it watches:
so the rank's exit status is known exactly, even when a signal ends the agent, and a signal sent to
this process (SIGTERM from ``scancel``, a time limit, mpirun) is passed on to it.

The run directory is the kind ``memdiag run`` writes:

- rank 0 creates DIR (refusing one that holds another run, unless ``--force``) and writes ``run.json``
  (``status: running``), naming the launcher, its command line as far as this host shows it (the
  ancestors of rank 0), the job, and the run id, which every rank derives from the launcher's job id;
- with ``--spool shared`` (the default) every rank then checks in under ``DIR/.memdiag-agents/``
  (:data:`AGENTS_DIR`) and waits until all have: a rank that cannot see or write DIR, or that found bad
  input, stops every rank before any starts the script (one line each, exit status 2);
- each rank, when its agent has ended, writes its exit status there; the last rank to do so completes
  ``run.json`` (per-rank status and exit codes, hosts, versions) and writes ``summary.json``
  (:func:`memdiag.launch.session.conclude`). With ``--spool local`` no rank but 0 needs DIR, and rank 0
  completes the run once its agent has received every rank's records over MPI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memdiag import ports
from memdiag._errors import UserError
from memdiag.agent import launcher_env
from memdiag.agentconfig import TF_DISTRIBUTE
from memdiag.format import rundir
from memdiag.format.manifest import manifest_path, read_manifest, write_manifest
from memdiag.format.reader import load_run
from memdiag.launch import session
from memdiag.launch.session import RunRequest

AGENTS_DIR = ".memdiag-agents"  # check-ins and exit statuses of the ranks (--spool shared)
LOCK = "conclude.lock"  # taken by the one rank that completes the run
# Signals a batch system or a user sends to end or warn a job: passed on to the agent.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
_POLL_S = 0.05


@dataclass(frozen=True)
class AgentRequest:
    run: RunRequest  # world_size: the launcher's
    memray_ranks: frozenset[int] | None = None  # None: --memray's choice for every rank
    trace_ranks: frozenset[int] | None = None  # None: every rank samples RSS at the fine interval
    start_timeout_s: float = 120.0  # how long ranks wait for each other to check in
    user_command: tuple[str, ...] = ()  # what followed `--`, as typed


# RSS sampling period of a rank left out of --trace-ranks: its per-step aggregates and VmHWM stay; the
# series is coarse (the sampler wakes 10 times a second rather than every --sample-ms).
COARSE_SAMPLE_S = 0.1


def user_target(words: list[str]) -> tuple[str, list[str]]:
    """``python [-u] train.py ARGS`` or ``train.py ARGS`` after `--`: the script and its arguments.
    memdiag's own interpreter runs the script (the agent imports the hooks into it)."""
    rest = list(words)
    if rest and os.path.basename(rest[0]).startswith("python") and not rest[0].endswith(".py"):
        rest = rest[1:]
        while rest and rest[0] in ("-u", "-B", "-O"):
            rest = rest[1:]
        if rest and rest[0].startswith("-"):
            raise UserError(f"`{' '.join(words)}`: memdiag agent runs a script file (python train.py ARGS); "
                            f"{rest[0]} is not supported")
    if not rest:
        raise UserError("nothing to run: give a built-in workload or `-- python train.py ARGS` after the options")
    return rest[0], rest[1:]


def parse_ranks(text: str, what: str) -> frozenset[int]:
    try:
        ranks = frozenset(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"{what} {text!r}: give comma-separated rank numbers, e.g. 0,7") from None
    if not ranks or min(ranks) < 0:
        raise UserError(f"{what} {text!r}: give comma-separated rank numbers of 0 or more, e.g. 0,7")
    return ranks


def run_id_of(job_id: str) -> str:
    """The run id every rank of one job derives alike, and the next job differently."""
    return hashlib.sha1(job_id.encode()).hexdigest()[:12]


def _ancestors(limit: int = 4) -> list[list[str]]:
    """The command lines of this process's parent and its parents (this host's view of the launcher):
    mpirun, horovodrun, or Slurm's step daemon."""
    found: list[list[str]] = []
    pid = os.getppid()
    for _ in range(limit):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
            with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if words:
            found.append(words)
        if parent <= 1:
            break
        pid = parent
    return found


def _horovodrun_mpirun(words: list[str]) -> bool:
    """The mpirun command horovodrun's MPI launcher runs: horovodrun replaces itself with it
    (``os.execve('/bin/sh', ['/bin/sh', '-c', MPIRUN_COMMAND])``, horovod/runner/mpi_run.py), so its
    own name is gone from the ranks' ancestors; the mark it leaves is ``-x NCCL_SOCKET_IFNAME=NICS``."""
    text = " ".join(words)
    return "mpirun" in text and "-x NCCL_SOCKET_IFNAME=" in text


def launcher_name(env: launcher_env.LauncherEnv, ancestors: list[list[str]]) -> str:
    """What the user typed to start the ranks, in a word: srun, mpirun, horovodrun, or the launcher's kind."""
    names = [os.path.basename(word) for words in ancestors for word in words[:3]]
    if any(name == "horovodrun" for name in names) or any(_horovodrun_mpirun(words) for words in ancestors):
        return "horovodrun"
    if env.launcher == launcher_env.OPENMPI:
        return "mpirun"
    if env.launcher == launcher_env.SLURM:
        return "srun"
    return env.launcher


def launcher_command(ancestors: list[list[str]]) -> list[str] | None:
    """The command that started the ranks, where this host shows it: horovodrun's, else mpirun's (srun's
    runs on the submitting host, outside the ranks' ancestors)."""
    for names in (("horovodrun",), ("mpirun", "mpiexec", "orterun", "prterun")):
        for words in reversed(ancestors):
            if any(os.path.basename(word) in names for word in words[:3]):
                return words
    return None


def _allocation(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The Slurm job the ranks run in (sbatch's ENVIRONMENT=BATCH tells a batch job from salloc's)."""
    if "SLURM_JOB_ID" not in environ:
        return None
    return {"job_id": environ["SLURM_JOB_ID"], "batch": environ.get("ENVIRONMENT") == "BATCH",
            "nodes": environ.get("SLURM_JOB_NODELIST"), "tasks": environ.get("SLURM_NTASKS"),
            "step": environ.get("SLURM_STEP_ID")}


class _Rank:
    """This rank's part: check, agree with the others, run the agent, end the run when last."""

    def __init__(self, request: AgentRequest, env: launcher_env.LauncherEnv, environ: Mapping[str, str]) -> None:
        self.request = request
        self.env = env
        self.environ = environ
        self.out = os.path.abspath(str(request.run.out))
        self.run_id = run_id_of(env.job_id)
        self.shared = request.run.options.spool == "shared"
        self.agents = os.path.join(self.out, AGENTS_DIR)

    # -- before the script ---------------------------------------------------------------------------
    def prepare(self) -> None:
        if self.env.rank == 0:
            self._create()
        if not self.shared:
            return
        try:
            if self.env.rank != 0:
                self._wait_for_manifest()
            self._check_in()
        except UserError:
            if self.env.rank == 0:
                # Nothing was measured: leave nothing that looks like a run behind.
                shutil.rmtree(self.out, ignore_errors=True)
            raise

    def _create(self) -> None:
        if os.path.isfile(manifest_path(self.out)):
            try:
                theirs = read_manifest(self.out).get("run_id")
            except UserError:
                theirs = None
            if theirs == self.run_id:
                raise UserError(f"--out {self.out} already holds this job's run (run id {self.run_id}): a job step "
                                "starts `memdiag agent` once per rank")
        rundir.prepare(self.out, self.request.run.force)
        os.makedirs(self.agents, exist_ok=True)
        ancestors = _ancestors()
        name = launcher_name(self.env, ancestors)
        config = session.agent_config(self.request.run, self.run_id, self.out)
        manifest_data = session.run_manifest(self.request.run, self.run_id, config, name)
        manifest_data.update({
            "launcher_env": self.env.as_record(),
            # This host's view of the launcher's command: rank 0's parent and its parents.
            "launcher_command": ancestors,
            "allocation": _allocation(self.environ),
            "agent_command": list(sys.argv),
            "user_command": list(self.request.user_command),
            "python": sys.executable,
            "memray_ranks": None if self.request.memray_ranks is None else sorted(self.request.memray_ranks),
            "trace_ranks": None if self.request.trace_ranks is None else sorted(self.request.trace_ranks),
            "spool": self.request.run.options.spool,
        })
        if self.request.run.engine == TF_DISTRIBUTE:
            manifest_data.update({"tf_ports": None, "tf_ports_by": "ranks"})
        if self.request.memray_ranks and not self.request.run.options.memray:
            manifest_data["changes_to_job"].append(
                f"--memray-ranks {','.join(map(str, sorted(self.request.memray_ranks)))}: allocations tracked on "
                "these ranks; oneDNN's pooled allocator off (TF_ENABLE_ONEDNN_OPTS=0) on every rank unless the "
                "environment sets it")
        write_manifest(self.out, manifest_data)

    def _wait_for_manifest(self) -> None:
        deadline = time.monotonic() + self.request.start_timeout_s
        while time.monotonic() < deadline:
            try:
                if read_manifest(self.out).get("run_id") == self.run_id:
                    return
            except UserError:  # not there yet (or not this job's): rank 0 writes it atomically
                pass
            time.sleep(_POLL_S)
        raise UserError(f"rank 0 did not create --out {self.out} within {self.request.start_timeout_s:g} s (see "
                        "rank 0's error), or this host does not share it: use a shared file system or --spool local")

    def _check_in(self) -> None:
        mine = os.path.join(self.agents, f"rank-{self.env.rank}.start.json")
        try:
            rundir.write_json(mine, {"run_id": self.run_id, "rank": self.env.rank, "host": self.env.host,
                                     "pid": os.getpid(), "pid_host": socket.gethostname()})
        except OSError as exc:
            raise UserError(f"cannot write to --out {self.out} from {self.env.host} ({exc.strerror}): every rank "
                            "writes its records there; choose a directory all ranks can write, or --spool local") \
                from None
        deadline = time.monotonic() + self.request.start_timeout_s
        while True:
            present = [r for r in range(self.env.size)
                       if os.path.exists(os.path.join(self.agents, f"rank-{r}.start.json"))]
            if len(present) == self.env.size:
                return
            if time.monotonic() > deadline:
                absent = sorted(set(range(self.env.size)) - set(present))
                raise UserError(f"rank(s) {_ranks_text(absent)} did not check in to --out {self.out} within "
                                f"{self.request.start_timeout_s:g} s: they failed (see their errors) or cannot write "
                                "there; choose a directory all ranks can write, or --spool local")
            time.sleep(_POLL_S)

    # -- the agent ---------------------------------------------------------------------------------------
    def config_text(self) -> str:
        config = session.agent_config(self.request.run, self.run_id, self.out)
        rank = self.env.rank
        if self.request.memray_ranks is not None:
            config = dataclasses.replace(config, memray=rank in self.request.memray_ranks)
        if self.request.trace_ranks is not None and rank not in self.request.trace_ranks:
            config = dataclasses.replace(config, sample_interval_s=max(config.sample_interval_s, COARSE_SAMPLE_S))
        return config.encode()

    def child_environment(self) -> dict[str, str]:
        env = {**self.environ, **session.rank_environment(self.request.run, self.out)}
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if self.request.run.engine == TF_DISTRIBUTE:
            # No launcher of memdiag's chose ports: the ranks choose and exchange theirs over MPI.
            env[ports.ENV] = ports.RANKS
        if self.request.memray_ranks:
            # As --memray does (memray cannot split oneDNN's pooled regions into tensors), on every rank
            # alike, so that the ranks still compute the same way.
            env.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
        return env

    def run_agent(self) -> int:
        """The agent as a child, signals passed on; its exit status (negative: the signal that ended it)."""
        child = subprocess.Popen([sys.executable, "-m", "memdiag.agent", self.config_text()],
                                 env=self.child_environment())
        def forward(signum: int, frame: object) -> None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

        for sig in FORWARDED:
            signal.signal(sig, forward)
        return child.wait()  # resumed after each forwarded signal (PEP 475)

    # -- after ----------------------------------------------------------------------------------------
    def finish(self, code: int) -> None:
        """Record this rank's exit status; the last rank completes run.json and writes summary.json."""
        if self.shared:
            try:
                rundir.write_json(os.path.join(self.agents, f"rank-{self.env.rank}.end.json"),
                                  {"run_id": self.run_id, "rank": self.env.rank, "exit_code": code,
                                   "host": self.env.host})
            except OSError:
                return
            codes = exit_codes(self.out)
            if len(codes) < self.env.size or not _take(os.path.join(self.agents, LOCK)):
                return
        elif self.env.rank != 0:
            return
        else:
            codes = {0: code}
        conclude_agents(self.out, codes)


def _take(path: str) -> bool:
    """True for the one process that creates ``path`` first."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def exit_codes(out: str) -> dict[int, int]:
    """The exit status each rank's ``memdiag agent`` recorded (negative: the signal that ended its agent)."""
    codes: dict[int, int] = {}
    folder = os.path.join(out, AGENTS_DIR)
    if not os.path.isdir(folder):
        return codes
    for name in os.listdir(folder):
        if name.endswith(".end.json"):
            try:
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    data = json.load(f)
                codes[int(data["rank"])] = int(data["exit_code"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return codes


def conclude_agents(out: str, codes: Mapping[int, int], unfinished: bool = False) -> None:
    """Complete run.json of a ``memdiag agent`` run from the ranks' records and exit statuses."""
    manifest = read_manifest(out)
    signals = sorted({-c for c in codes.values() if c < 0} | {c - 128 for c in codes.values() if 128 < c < 160})
    run = load_run(out)
    terminated = sorted({str(r.end.get("signal")) for r in run.ranks.values()
                         if r.end and r.end.get("status") == "terminated" and r.end.get("signal")})
    signal_name = terminated[0] if terminated else None
    if signal_name is None and signals and all(s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) for s in signals):
        signal_name = signal.Signals(signals[0]).name
    worst = next((c for c in codes.values() if c != 0), 0)
    session.conclude(out, manifest, returncode=worst, timed_out=False, wall_s=time.time() - manifest["created"],
                     command=launcher_command(manifest.get("launcher_command") or []), signal_name=signal_name,
                     exit_codes=codes, unfinished=unfinished)


def exit_status(code: int) -> int:
    """The shell's view of an agent's exit: 128 + the signal that ended it."""
    return 128 - code if code < 0 else code


def run_rank(request: AgentRequest, environ: Mapping[str, str] | None = None) -> int:
    """This rank, from the first check to the run's completion; its exit status."""
    environ = dict(os.environ if environ is None else environ)
    try:
        env = launcher_env.detect(environ)
    except launcher_env.LauncherEnvError as exc:
        raise UserError(str(exc)) from None
    run_request = dataclasses.replace(request.run, world_size=env.size)
    session.validate(run_request, launcher_needed=False)
    for what, ranks in (("--memray-ranks", request.memray_ranks), ("--trace-ranks", request.trace_ranks)):
        if ranks is not None and max(ranks) >= env.size:
            raise UserError(f"{what} names rank {max(ranks)}, but the job has {env.size} rank(s) (0-{env.size - 1})")
    rank = _Rank(dataclasses.replace(request, run=run_request), env, environ)
    rank.prepare()
    code = rank.run_agent()
    rank.finish(code)
    return exit_status(code)


def unfinished_agents_alive(out: str) -> list[int]:
    """Pids, on this host, of ``memdiag agent`` ranks of the run at ``out`` that still run."""
    alive: list[int] = []
    folder = os.path.join(out, AGENTS_DIR)
    if not os.path.isdir(folder):
        return alive
    here = socket.gethostname()
    for name in os.listdir(folder):
        if not name.endswith(".start.json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                data = json.load(f)
            if data.get("pid_host") == here and os.path.exists(f"/proc/{int(data['pid'])}"):
                alive.append(int(data["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return alive


