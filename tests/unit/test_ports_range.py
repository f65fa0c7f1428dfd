"""The launcher's ports for MultiWorkerMirroredStrategy's workers lie below the kernel's range of
source ports for outgoing connections, where no outgoing connection can take one before its server
binds it; where no such range is known, the kernel chooses."""

from __future__ import annotations

import socket

from memdiag import ports


def _range_file(tmp_path, low: int, high: int) -> str:
    path = tmp_path / "ip_local_port_range"
    path.write_text(f"{low}\t{high}\n")
    return str(path)


def test_ports_are_distinct_and_below_the_outgoing_range(tmp_path):
    path = _range_file(tmp_path, 32768, 60999)
    chosen = ports.free_ports(8, path)
    assert len(set(chosen)) == 8
    assert all(ports.LOWEST_PORT <= p < 32768 for p in chosen), chosen


def test_without_a_range_below_the_lowest_port_the_kernel_chooses(tmp_path):
    path = _range_file(tmp_path, 1024, 65535)  # no port between LOWEST_PORT and the range's start
    assert ports.outgoing_port_range(path) == (1024, 65535)
    chosen = ports.free_ports(3, path)
    assert len(set(chosen)) == 3 and all(0 < p < 65536 for p in chosen)
    assert ports.outgoing_port_range(str(tmp_path / "missing")) is None


def test_a_port_in_use_is_never_handed_out(tmp_path):
    # GIVEN a range that leaves one candidate, LOWEST_PORT, and that port held by another socket
    path = _range_file(tmp_path, ports.LOWEST_PORT + 1, 65535)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", ports.LOWEST_PORT))
        # WHEN a port is chosen
        chosen = ports.free_ports(1, path)
    # THEN it is not the held one (the kernel chose instead)
    assert chosen != [ports.LOWEST_PORT]
    # and with the port free again, it is the one chosen
    assert ports.free_ports(1, path) == [ports.LOWEST_PORT]
