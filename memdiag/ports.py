"""TCP ports for the workers of ``--engine tf-distribute``: chosen by the launcher on one host, by
each rank with ``--hosts``.

Each MultiWorkerMirroredStrategy worker starts a gRPC server on the port of its own entry in
TF_CONFIG's cluster, one worker per rank. On one host (``localhost:PORT``) the launcher asks
the kernel for N free ports (bind port 0, read the port, close), all held at the same time so they
are distinct, and passes them to the ranks in ``MEMDIAG_TF_PORTS`` (mpirun forwards ``MEMDIAG_*``).
The sockets bind every interface, as TensorFlow's gRPC server does, so a port in use on any of them
is not handed out. The ports are taken below the kernel's range for outgoing connections
(``ip_local_port_range``): a port of that range, free when chosen, can become the source port of
any outgoing connection before the server binds it (seen once in a test run: "Could not start gRPC
server" on such a port at the job's start); below it, only a process binding that very port can.
Where no such port is free, the kernel's choice (port 0) is taken.
With ``--hosts`` each rank holds a free port of its own host and finds its own address (below).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator, Mapping

ENV = "MEMDIAG_TF_PORTS"


LOCAL_PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST_PORT = 10000  # below: ports that services commonly claim


def outgoing_port_range(path: str = LOCAL_PORT_RANGE) -> tuple[int, int] | None:
    """The kernel's range of source ports for outgoing connections, or None where it cannot be read."""
    try:
        with open(path, encoding="ascii") as f:
            low, high = (int(p) for p in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return low, high


def _bind_free(sock: socket.socket, candidates: list[int]) -> None:
    """Bind ``sock`` on every interface to the first free port of ``candidates``, else to the kernel's choice."""
    for port in candidates:
        try:
            sock.bind(("", port))
            return
        except OSError:
            continue
    sock.bind(("", 0))


def _candidates(path: str = LOCAL_PORT_RANGE) -> list[int]:
    """Ports below the outgoing range, in random order (so that jobs starting together rarely try the same)."""
    import random

    found = outgoing_port_range(path)
    if found is None or found[0] <= LOWEST_PORT:
        return []
    ports = list(range(LOWEST_PORT, found[0]))
    random.SystemRandom().shuffle(ports)
    return ports[:256]


def free_ports(count: int, path: str = LOCAL_PORT_RANGE) -> list[int]:
    """``count`` distinct TCP ports that were free when asked for, below the outgoing range where one is free."""
    if count < 0:
        raise ValueError(f"a number of ports must be 0 or more, got {count}")
    candidates = _candidates(path)
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in sockets:
            _bind_free(sock, candidates)
        return [sock.getsockname()[1] for sock in sockets]


def encode(ports: list[int]) -> str:
    return ",".join(str(p) for p in ports)


def decode(text: str) -> list[int]:
    """The ports of :data:`ENV` (``"41001,41002"``); ValueError if it is not a list of ports."""
    ports = [int(p) for p in text.split(",") if p.strip()]
    if any(not 0 < p < 65536 for p in ports):
        raise ValueError(f"{ENV}={text!r}: not a list of TCP ports")
    return ports


# --hosts: the launcher cannot know which ports are free on the other hosts, so it passes this in
# ``MEMDIAG_TF_PORTS`` instead of ports, and each rank chooses its own port and address
# (:func:`hold_free_port`, :func:`own_address`); the ranks exchange them with one MPI allgather
# (memdiag/agent/rank_strategy.py, ``_gather_tf_cluster``).
RANKS = "ranks"
# An explicit choice of the network: an IPv4 address (the launching host's on that network, or any
# other host's there); each rank then uses its own address on the route to it. The same value serves
# every host, as mpirun forwards it (``MEMDIAG_*``).
ADDRESS_ENV = "MEMDIAG_TF_ADDRESS"
# OpenMPI 4's contact URI of mpirun (the HNP), in every rank's environment:
# ``JOBID.VPID;tcp://ADDR[,ADDR...]:PORT;tcp6://[ADDR]:PORT``.
HNP_URI_ENV = "OMPI_MCA_orte_hnp_uri"


@contextlib.contextmanager
def hold_free_port() -> Iterator[int]:
    """A free TCP port of this host, bound on every interface while the block runs (ranks sharing a
    host, each holding its own while they exchange them, get distinct ports), released after it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        _bind_free(sock, _candidates())
        yield int(sock.getsockname()[1])


def hnp_addresses(uri: str) -> list[str]:
    """The IPv4 addresses in an OpenMPI contact URI, in its order (``tcp6`` and others left out)."""
    found: list[str] = []
    for part in uri.split(";"):
        if not part.startswith("tcp://"):
            continue
        hosts = part[len("tcp://"):].rpartition(":")[0]
        found.extend(a.strip() for a in hosts.split(",") if a.strip() and a.strip() not in found)
    return found


def route_address(target: str) -> str | None:
    """This host's IPv4 address on the route to ``target`` (a UDP socket connected to it: no packet is
    sent), or None when there is no route (or ``target`` is no IPv4 address)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((target, 9))
            return str(sock.getsockname()[0])
    except (OSError, UnicodeError):
        return None


def own_address(environ: Mapping[str, str] | None = None,
                route: Callable[[str], str | None] = route_address) -> tuple[str, str]:
    """The address by which this rank's peers on other hosts reach it, and how it was found:
    ``MEMDIAG_TF_ADDRESS`` (the route to it), else the route to mpirun's host (its contact URI; of its
    addresses, the first whose route leaves from another address than its own, which is a path to
    another host, else the first routed one), else the host name's address. ValueError, in one line
    naming what to set, when none is found."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(ADDRESS_ENV, "").strip()
    if explicit:
        local = route(explicit)
        if local is None:
            raise ValueError(f"{ADDRESS_ENV}={explicit!r}: no IPv4 route to it from {socket.gethostname()}; "
                             "set it to an IPv4 address on the network the workers share")
        return local, f"{ADDRESS_ENV}={explicit}"
    routed = [(target, local) for target in hnp_addresses(environ.get(HNP_URI_ENV, ""))
              if (local := route(target)) is not None]
    for target, local in routed:
        if local != target:
            return local, f"route to mpirun's host {target}"
    if routed:
        return routed[0][1], f"route to mpirun's host {routed[0][0]}"
    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
    except OSError:
        address = ""
    if address:
        return address, f"host name {host}"
    raise ValueError(f"no address found for this worker on {host} (no {HNP_URI_ENV}, and the host name does "
                     f"not resolve): set {ADDRESS_ENV} to an IPv4 address on the network the workers share")
