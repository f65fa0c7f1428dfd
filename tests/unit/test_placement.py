"""Where mpirun puts each rank with ``-H host:slots``, and what the scaling study concludes from it."""

import json
import socket
from collections import Counter

import pytest

from memdiag._errors import UserError
from memdiag.analyze.scaling import measured_row, study_warnings
from memdiag.launch.mpirun import parse_hosts, placement, ranks_per_host

# `mpirun --oversubscribe -H HOSTS -np N --display-map` of OpenMPI 4.1.4, rank by rank.
DISPLAY_MAP = [
    ("hostA:2,hostB:2", 4, "AABB"),
    ("hostA:2,hostB:2", 2, "AA"),  # both on the first host: its slots are filled first
    ("hostA:2,hostB:2", 3, "AAB"),
    ("hostA:1,hostB:4", 3, "ABB"),
    ("hostA:2,hostB:2", 6, "AAABBB"),  # oversubscribed: the ranks past the slots are spread evenly
    ("hostA:2,hostB:2", 7, "AAAABBB"),  # ... the first host taking the one left over
    ("hostA:2,hostB:1", 5, "AAABB"),
    ("hostA:3,hostB:1,hostC:2", 9, "AAAABBCCC"),
    ("hostA,hostB", 4, "AABB"),  # a host without a count has one slot
    ("hostA:2,hostA:2", 4, "AAAA"),  # a host named twice has the sum
]


@pytest.mark.parametrize("hosts,world_size,expected", DISPLAY_MAP)
def test_placement_is_the_one_mpirun_displays(hosts, world_size, expected):
    assert "".join(host[-1] for host in placement(world_size, hosts)) == expected


def test_without_hosts_every_rank_is_on_the_launching_host():
    assert placement(3, None) == [socket.gethostname()] * 3
    assert ranks_per_host(3, None) == 3


@pytest.mark.parametrize("hosts,world_size,expected", [
    ("node1:4,node2:4", 2, 2),  # spread evenly this would be 1 per host
    ("node1:4,node2:4", 8, 4),
    ("hostA:2,hostB:2", 7, 4),
    (",".join(f"node{i}:4" for i in range(1, 9)), 4, 4),
])
def test_ranks_per_host_is_the_most_crowded_host(hosts, world_size, expected):
    assert ranks_per_host(world_size, hosts) == expected
    assert ranks_per_host(world_size, hosts) == max(Counter(placement(world_size, hosts)).values())


@pytest.mark.parametrize("hosts", ["node1:0", "node1:four", ":4", "node1:4,,node2:4"])
def test_a_malformed_host_list_is_a_one_line_error(hosts):
    with pytest.raises(UserError, match="--hosts"):
        parse_hosts(hosts)


def _row(tmp_path, world_size: int, hosts: str, cores: int) -> dict:
    """One rank count of a study, read back as `memdiag scale` reads it (no rank records needed)."""
    run = tmp_path / f"n{world_size}"
    run.mkdir()
    summary = {"world_size": world_size, "status": "ok", "throughput_items_per_s": 100.0 * world_size,
               "ranks": [{"rank": r, "step_time_s": 1.0, "collective_bytes_per_step": 0,
                          "allgather_bytes_per_step": 0, "allreduce_bytes_per_step": 0} for r in range(world_size)]}
    manifest = {"world_size": world_size, "hosts": hosts, "cores_per_host": cores, "oversubscribed": False}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "run.json").write_text(json.dumps(manifest))
    return measured_row(summary, manifest, str(run))


def test_the_documented_eight_node_study_is_a_scaling_experiment(tmp_path):
    # GIVEN docs/howto/scaling-study.md's study: 4 slots on each of 8 four-core nodes, N = 4, 8, 16, 32
    hosts = ",".join(f"node{i}:4" for i in range(1, 9))
    rows = [_row(tmp_path, n, hosts, cores=4) for n in (4, 8, 16, 32)]
    # THEN mpirun fills node after node: 4 ranks on each used node, one core per rank at every N
    assert [r["ranks_per_host"] for r in rows] == [4, 4, 4, 4]
    assert [r["cores_per_rank"] for r in rows] == [1, 1, 1, 1]
    ok, warnings = study_warnings(rows)
    assert ok and warnings == []


def test_ranks_filling_the_first_host_past_its_cores_is_not_a_scaling_experiment(tmp_path):
    # GIVEN two 2-core hosts with 4 slots each: N=2 fits the first host, N=4 crowds it
    rows = [_row(tmp_path, n, "hostA:4,hostB:4", cores=2) for n in (2, 4)]
    assert [r["ranks_per_host"] for r in rows] == [2, 4]
    assert rows[1]["oversubscribed"]
    ok, warnings = study_warnings(rows)
    assert not ok and "N=4 put 4 ranks on a host with 2 cores (oversubscribed)" in warnings[0]
