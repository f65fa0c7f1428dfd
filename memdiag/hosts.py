"""Where mpirun puts ranks: the host list of ``--hosts`` and OpenMPI's placement of ranks on it.

Pure functions, shared by the launcher (the manifest records the placement) and the analysis of a
scaling study (what shared a host's cores).
"""

from __future__ import annotations

import socket

from memdiag._errors import UserError


def parse_hosts(hosts: str) -> list[tuple[str, int]]:
    """``-H`` as OpenMPI 4.1 reads it: hosts in order of first mention with their slots (``host:N``;
    a host without a count has 1 slot; a host named twice has the sum)."""
    slots: dict[str, int] = {}
    for entry in hosts.split(","):
        name, _, count = entry.strip().partition(":")
        if not name:
            raise UserError(f"--hosts {hosts}: give host names with their slots, e.g. node1:4,node2:4")
        if count and not (count.isdigit() and int(count) > 0):
            raise UserError(f"--hosts {hosts}: {entry!r} needs a positive slot count, e.g. {name}:4")
        slots[name] = slots.get(name, 0) + (int(count) if count else 1)
    return list(slots.items())


def placement(world_size: int, hosts: str | None) -> list[str]:
    """The host of each rank, as ``mpirun -np world_size --oversubscribe -H hosts`` places them
    (OpenMPI 4.1's default mapping by slot, orte/mca/rmaps/round_robin/rmaps_rr_mappers.c,
    orte_rmaps_rr_byslot; checked against ``mpirun --display-map``):

    - hosts are filled in order up to their slots: -H a:2,b:2 -np 3 puts ranks 0,1 on a and 2 on b;
    - ranks past the slots of all hosts are spread evenly, the first hosts taking one more when they
      do not divide: -H a:2,b:2 -np 7 gives a 4 and b 3;
    - ranks are numbered host by host: -H a:2,b:2 -np 7 puts ranks 0-3 on a and 4-6 on b.

    Without hosts every rank runs on the launching host.
    """
    if not hosts:
        return [socket.gethostname()] * world_size
    nodes = parse_hosts(hosts)
    counts = [min(slots, max(0, world_size - sum(s for _, s in nodes[:i]))) for i, (_, slots) in enumerate(nodes)]
    extra = world_size - sum(counts)
    if extra > 0:
        balance, remainder = divmod(extra, len(nodes))
        counts = [c + balance + (1 if i < remainder else 0) for i, c in enumerate(counts)]
    return [name for (name, _), count in zip(nodes, counts) for _ in range(count)]


def ranks_per_host(world_size: int, hosts: str | None) -> int:
    """The most ranks that :func:`placement` puts on one host: what shares a host's cores."""
    per_host: dict[str, int] = {}
    for host in placement(world_size, hosts):
        per_host[host] = per_host.get(host, 0) + 1
    return max(per_host.values(), default=0)
