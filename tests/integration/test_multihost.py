"""The multi-host path on one machine: ranks on two simulated hosts (tests/hosts), no shared /tmp, and
the run directory visible to the launching host only (``--spool local``).

Real mpirun, real Horovod (and one run of TensorFlow's MultiWorkerMirroredStrategy, ``--engine
tf-distribute``, whose ranks exchange their own addresses and ports). Skipped, with the reason, only where
the host running them refuses a simulated host's namespaces (tests/hosts/simulated.py probes that alone);
any other failure to set up the hosts fails the tests. Run them alone with

    .venv/bin/python -m pytest tests/integration/test_multihost.py
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from memdiag.format.reader import RankRecords, read_rank_file
from memdiag.launch.mpirun import placement
from tests.helpers import read_json, read_records
from tests.hosts.simulated import (
    SimulatedCluster,
    agent_env,
    layout_problem,
    mpirun_base,
    namespaces_unavailable,
    processes_matching,
)

pytestmark = pytest.mark.mpi
HOSTS = "hostA:2,hostB:2"
SCRIPT = Path(__file__).resolve().parent.parent / "hosts" / "alltoall_to_one_rank.py"
# What a TensorFlow process leaves in /tmp when it is killed: the sources autograph generates for each
# tf.function, which it removes when the process exits normally. memdiag leaves nothing of its own.
AUTOGRAPH = "__autograph_generated_file"


@pytest.fixture(scope="module")
def cluster():
    reason = namespaces_unavailable()  # a SetupError (another failure of the probe) fails the tests
    if reason is not None:
        pytest.skip(f"hosts cannot be simulated here: {reason}")
    problem = layout_problem()
    if problem is not None:
        pytest.fail(f"simulated hosts cannot be set up: {problem}")
    simulated = SimulatedCluster(launch_host="hostA")
    yield simulated
    simulated.remove()


@pytest.fixture(scope="module")
def two_host_run(cluster):
    out = cluster.runs / "tiny-n4"
    result, report = cluster.memdiag("run", "transformer", "--preset", "tiny", "--steps", "2", "-n", "4",
                                     "--hosts", HOSTS, "--spool", "local", "--timeout", "600", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out, report


def agents_of(run_id: str) -> list[str]:
    """memdiag agents of this run still running (their argument is the run's config, base64 JSON)."""
    found = []
    for line in processes_matching("memdiag.agent"):
        try:
            config = base64.urlsafe_b64decode(line.split()[-1].encode()).decode()
        except ValueError:
            continue
        if run_id in config:
            found.append(line)
    return found


def rank_records(out: Path, rank: int) -> RankRecords:
    """A rank's records as memdiag reads them: a rank torn down mid-write may end in a partial line."""
    return read_rank_file(str(out / f"rank-{rank}.jsonl"), rank)


def eventually_empty(find: Callable[[], list[str]], wait_s: float = 15.0) -> list[str]:
    """What ``find`` still finds after up to ``wait_s``: processes take a moment to exit."""
    deadline = time.monotonic() + wait_s
    while (found := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def assert_nothing_left(cluster: SimulatedCluster, report: Path, run_id: str) -> dict[str, list[str]]:
    """No process of the run on any host, and nothing of memdiag's or OpenMPI's in any host's /tmp."""
    left = cluster.left_in_tmp(report, {"hostA", "hostB"})  # each host's daemon has exited
    assert set(left) == {"hostA", "hostB"}, left
    for host, entries in left.items():
        assert [e for e in entries if not e.startswith(AUTOGRAPH)] == [], (host, entries)
    assert eventually_empty(lambda: agents_of(run_id)) == []
    assert eventually_empty(lambda: processes_matching("orted", "hostA")) == []
    assert eventually_empty(lambda: processes_matching("memdiag-sim-tmp")) == []
    return left


@pytest.mark.parametrize("hosts,world_size", [("hostA:2,hostB:2", 4), ("hostA:2,hostB:2", 2),
                                              ("hostA:1,hostB:4", 3), ("hostA:2,hostB:1", 5)])
def test_placement_is_where_mpirun_starts_the_ranks(cluster, hosts, world_size):
    # WHEN mpirun starts plain processes on the simulated hosts, each saying where it runs
    cmd = [*mpirun_base(), "-H", hosts, "-np", str(world_size), "sh", "-c",
           'echo "rank $OMPI_COMM_WORLD_RANK $(hostname)"']
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                            env={**os.environ, **agent_env()})
    assert result.returncode == 0, result.stdout + result.stderr
    seen = dict(line.split()[1:] for line in result.stdout.splitlines() if line.startswith("rank "))
    # THEN memdiag's placement is the ranks' own report, rank by rank
    assert [seen[str(rank)] for rank in range(world_size)] == placement(world_size, hosts)


def test_a_run_across_two_hosts_delivers_every_ranks_records_to_the_run_directory(cluster, two_host_run):
    out, report = two_host_run
    manifest = read_json(out / "run.json")
    assert manifest["status"] == "ok" and manifest["rank_status"] == {str(r): "ok" for r in range(4)}
    assert manifest["placement"] == ["hostA", "hostA", "hostB", "hostB"]
    summary = read_json(out / "summary.json")
    assert [(r["rank"], r["host"]) for r in summary["ranks"]] == list(enumerate(manifest["placement"]))
    for rank in range(4):
        records = read_records(out / f"rank-{rank}.jsonl")  # every line whole: streamed chunks joined up
        start = next(r for r in records if r["type"] == "start")
        assert start["host"] == manifest["placement"][rank]
        assert start["local_size"] == 2 and start["size"] == 4  # Horovod sees two hosts of two ranks
        assert [r["step"] for r in records if r["type"] == "step"] == [-1, 0, 1]
        assert records[-1]["type"] == "end" and records[-1]["status"] == "ok"
    assert (out / "params.npz").is_file()
    assert summary["consistency"]["ranks_identical"] is True
    # The spool folders were removed on both hosts, and no process is left.
    left = assert_nothing_left(cluster, report, manifest["run_id"])
    assert left == {"hostA": [], "hostB": []}


def test_a_rank_killed_by_its_memory_limit_has_its_record_delivered_and_nothing_hangs(cluster, two_host_run):
    # GIVEN a limit just above the set-up peak of the run above (the first step's peak lies 60 MiB or
    # more above it, and varies from run to run by as much): every rank passes it by the first step,
    # and whichever passes it first is killed, the run torn down after it
    done, _ = two_host_run
    setup = max(s["peak_rss_bytes"] for rank in range(4) for s in rank_records(done, rank).steps if s["step"] == -1)
    limit = setup + 8 * 2**20
    out = cluster.runs / "tiny-n4-killed"
    # WHEN the same run is made under that limit
    result, report = cluster.memdiag("run", "transformer", "--preset", "tiny", "--steps", "2", "-n", "4",
                                     "--hosts", HOSTS, "--spool", "local", "--timeout", "600",
                                     "--mem-limit", str(limit), "--out", str(out))
    # THEN it fails without waiting for the timeout, and the killed rank's record is in the run directory
    assert result.returncode == 1, result.stdout + result.stderr
    manifest = read_json(out / "run.json")
    assert manifest["status"] == "failed" and not manifest["timed_out"]
    ranks = {rank: rank_records(out, rank) for rank in range(4)}
    killed = {rank: records.killed for rank, records in ranks.items() if records.killed}
    assert killed, "no killed record reached the run directory"
    for rank, record in killed.items():
        assert record["reason"] == "mem-limit" and record["limit_bytes"] == limit < record["rss_bytes"]
        assert "in_flight" in record and "received_this_step" in record
        # every step it completed came with it
        assert [s["step"] for s in ranks[rank].steps] == list(range(-1, record["step"]))
    # The ranks torn down after it had streamed their records up to then, their start among them.
    for rank, records in ranks.items():
        assert records.start is not None and records.start["host"] == manifest["placement"][rank]
    failure = read_json(out / "summary.json")["failure"]
    assert failure["kind"] == "mem-limit" and f"rank {min(killed)} killed at step" in failure["headline"]
    assert "killed at step" in result.stdout
    assert_nothing_left(cluster, report, manifest["run_id"])


def test_a_rank_on_the_other_host_killed_inside_a_collective_names_it_in_the_run_directory(cluster, two_host_run):
    # GIVEN a job whose last rank (on hostB) alone receives 1 GiB in an alltoall, the others 256 MiB
    # in and a few rows out, and a limit 600 MiB above the Transformer's set-up peak: between the two
    done, _ = two_host_run
    setup = max(s["peak_rss_bytes"] for rank in range(4) for s in rank_records(done, rank).steps if s["step"] == -1)
    limit = setup + 600 * 2**20
    out = cluster.runs / "alltoall-killed"
    result, report = cluster.memdiag("run", str(SCRIPT), "-n", "4", "--hosts", HOSTS, "--spool", "local",
                                     "--timeout", "600", "--mem-limit", str(limit), "--out", str(out),
                                     "--", "--rows", "65536")
    # THEN only rank 3 is killed, inside the alltoall, and its record crossed from hostB to the run directory
    assert result.returncode == 1, result.stdout + result.stderr
    manifest = read_json(out / "run.json")
    assert manifest["placement"][3] == "hostB" and not manifest["timed_out"]
    kills = {rank: records.killed for rank in range(4) if (records := rank_records(out, rank)).killed}
    assert list(kills) == [3], kills
    flight = kills[3]["in_flight"]
    assert flight is not None and flight["op"] == "alltoall" and "rows_to_the_last_rank" in flight["name"]
    headline = read_json(out / "summary.json")["failure"]["headline"]
    assert headline.startswith("rank 3 killed") and "in alltoall of" in headline
    assert_nothing_left(cluster, report, manifest["run_id"])


@pytest.mark.slow
def test_a_scaling_study_reads_the_placement_of_each_rank_count(cluster):
    out = cluster.runs / "scale-weak"
    result, report = cluster.memdiag("scale", "transformer", "--ranks", "2,4", "--weak", "--steps", "2",
                                     "--hosts", HOSTS, "--spool", "local", "--timeout", "600", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    scale = read_json(out / "scale.json")
    # N=2 fills hostA's two slots; N=4 puts two ranks on each host
    for n, expected in ((2, {"hostA": 2}), (4, {"hostA": 2, "hostB": 2})):
        ran = Counter(r["host"] for r in read_json(out / f"n{n}" / "summary.json")["ranks"])
        assert ran == expected
    assert [r["ranks_per_host"] for r in scale["rows"]] == [2, 2]
    cores = os.cpu_count() or 1
    assert [r["cores_per_rank"] for r in scale["rows"]] == [max(1, cores // 2)] * 2
    # Two ranks per host at both N: the same cores per rank, so a scaling experiment wherever a host
    # has a core per rank (the simulated hosts share the cores of one real machine, which memdiag cannot see).
    assert scale["scaling_experiment"] is (cores >= 2)
    assert json.loads((out / "n2" / "run.json").read_text())["placement"] == ["hostA", "hostA"]
    left = cluster.left_in_tmp(report, {"hostA"})
    assert left.get("hostA") == [] and all(entries == [] for entries in left.values()), left


MWMS_SCRIPT = Path(__file__).resolve().parent.parent.parent / "examples" / "user_mwms_embedding.py"
# Worked out by hand: worker r looks up 1000 + 500 r rows of a 256-wide float32 table (1024 B a row) with
# int32 ids (4 B); MWMS pads every worker's rows to the longest (2500 at N=4), so each worker receives
# N x max x (row + index) = 4 x 2500 x 1028 B per step in the values and indices gathers.
MWMS_GATHERED = 4 * 2500 * 1028  # 10,280,000


@pytest.mark.tfdist
def test_mwms_across_two_hosts_exchanges_the_ranks_addresses_and_ports(cluster):
    # WHEN a user's MultiWorkerMirroredStrategy script runs on two simulated hosts, records spooled locally
    out = cluster.runs / "mwms-n4"
    result, report = cluster.memdiag("run", str(MWMS_SCRIPT), "-n", "4", "--engine", "tf-distribute",
                                     "--hosts", HOSTS, "--spool", "local", "--timeout", "300", "--out", str(out),
                                     "--", "--steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = read_json(out / "run.json")
    assert manifest["status"] == "ok" and manifest["rank_status"] == {str(r): "ok" for r in range(4)}
    # THEN the ports were the ranks' own, not the launcher's
    assert manifest["tf_ports"] is None and manifest["tf_ports_by"] == "ranks"
    workers = None
    for rank in range(4):
        records = read_records(out / f"rank-{rank}.jsonl")
        start = next(r for r in records if r["type"] == "start")
        assert start["host"] == manifest["placement"][rank] and start["size"] == 4
        tf_config = start["tf_config"]
        assert tf_config["source"] == "memdiag" and tf_config["ports_by"] == "ranks"
        value = json.loads(tf_config["value"])
        # every rank wrote the same worker list, 4 distinct ADDR:PORT, its own entry at its own index
        assert value["task"] == {"type": "worker", "index": rank}
        workers = workers or value["cluster"]["worker"]
        assert value["cluster"]["worker"] == workers and len(set(workers)) == 4
        assert workers[rank] == f"{tf_config['address']}:{tf_config['port']}"
        assert all(w.rpartition(":")[0] and not w.startswith("localhost") for w in workers)
        # every step's records delivered, and MWMS's padded gathers of values and indices
        assert [r["step"] for r in records if r["type"] == "step"] == [-1, 0, 1]
        assert records[-1]["type"] == "end" and records[-1]["status"] == "ok"
        for step in (0, 1):
            gathered = sum(r["bytes_out"] for r in records if r["type"] == "collective" and r["step"] == step
                           and r["op"] == "allgather" and r.get("stage") in ("values", "indices"))
            assert gathered == MWMS_GATHERED, (rank, step, gathered)
    left = assert_nothing_left(cluster, report, manifest["run_id"])
    assert all(e.startswith(AUTOGRAPH) for entries in left.values() for e in entries), left
