"""TCP ports for the workers of ``--engine tf-distribute``, chosen by the launcher.

Each MultiWorkerMirroredStrategy worker starts a gRPC server on the port of its own entry in
TF_CONFIG's cluster (``localhost:PORT``, one worker per rank, all on this host). The launcher asks
the kernel for N free ports (bind port 0, read the port, close), all held at the same time so they
are distinct, and passes them to the ranks in ``MEMDIAG_TF_PORTS`` (mpirun forwards ``MEMDIAG_*``).
The sockets bind every interface, as TensorFlow's gRPC server does, so a port in use on any of them
is not handed out. Between the release here and the servers' binds another process could take a
port; TensorFlow then fails with "Could not start gRPC server", and a new run chooses new ports.
"""

from __future__ import annotations

import contextlib
import socket

ENV = "MEMDIAG_TF_PORTS"


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free when asked for."""
    if count < 0:
        raise ValueError(f"a number of ports must be 0 or more, got {count}")
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]


def encode(ports: list[int]) -> str:
    return ",".join(str(p) for p in ports)


def decode(text: str) -> list[int]:
    """The ports of :data:`ENV` (``"41001,41002"``); ValueError if it is not a list of ports."""
    ports = [int(p) for p in text.split(",") if p.strip()]
    if any(not 0 < p < 65536 for p in ports):
        raise ValueError(f"{ENV}={text!r}: not a list of TCP ports")
    return ports
