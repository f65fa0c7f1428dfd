"""One rank of a tf.distribute job (MultiWorkerMirroredStrategy): TF_CONFIG written, the strategy hooked, its start record.

With ``--engine tf-distribute`` (a script, or a built-in workload's MultiWorkerMirroredStrategy
variant) nothing imports Horovod: ranks come from MPI's environment, memdiag's own agreements go
through mpi4py, and the strategy's collectives are hooked instead (:mod:`memdiag.agent.hooks_tf`).
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

from memdiag import agreement
from memdiag.agent.rank_env import cpus_allowed, mpi_version, ranks_on_node, world_size_from_env
from memdiag.agent.tracer import Tracer
from memdiag.agent.workload_run import run_builtin, run_script
from memdiag.agentconfig import AgentConfig
from memdiag.format import rundir
from memdiag.format.layout import RECORDS_FORMAT
from memdiag.format.records import StartRecord
from memdiag.format.writer import RecordWriter


def write_tf_config(rank: int, size: int) -> dict[str, Any]:
    """TF_CONFIG for worker ``rank`` of ``size``: at ``localhost`` on the ports the launcher chose
    (``MEMDIAG_TF_PORTS``, one host), or, with ``--hosts`` (``MEMDIAG_TF_PORTS=ranks``), at the addresses
    and ports the ranks chose and exchanged (:func:`_gather_tf_cluster`); a TF_CONFIG already in the
    environment is the user's and is kept.
    Returns what the start record says of it (``error``: why none could be written)."""
    import json

    from memdiag import ports

    gathered: tuple[list[str], dict[str, Any]] | str | None = None
    if os.environ.get(ports.ENV) == ports.RANKS:
        # Every rank takes part, a user's TF_CONFIG or not: mpirun may hand it to some hosts' ranks only.
        try:
            gathered = _gather_tf_cluster(rank, size)
        except ValueError as exc:
            gathered = str(exc)
    if os.environ.get("TF_CONFIG"):
        return {"source": "environment", "value": os.environ["TF_CONFIG"]}
    chosen: dict[str, Any] = {}
    if isinstance(gathered, str):
        return {"error": gathered}
    if gathered is not None:
        workers, chosen = gathered
    else:
        try:
            launcher_ports = ports.decode(os.environ.get(ports.ENV, ""))
        except ValueError as exc:
            return {"error": str(exc)}
        if len(launcher_ports) != size:
            return {"error": f"{ports.ENV} gives {len(launcher_ports)} port(s) for {size} rank(s): run through "
                             "`memdiag run`"}
        workers = [f"localhost:{p}" for p in launcher_ports]
        chosen = {"ports_by": "launcher"}
    value = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
    os.environ["TF_CONFIG"] = value
    return {"source": "memdiag", "value": value, **chosen}


def _gather_tf_cluster(rank: int, size: int) -> tuple[list[str], dict[str, Any]]:
    """``--hosts``: this rank's address (:func:`memdiag.ports.own_address`) and a free port of its
    own host, exchanged with every rank's in one MPI allgather (mpi4py, before TensorFlow), the port held
    until every rank has chosen, so that ranks sharing a host choose distinct ones. Returns the workers
    ``ADDR:PORT`` in rank order and what the start record says of this rank's choice; ValueError (the
    same on every rank) when a rank found no address."""
    from mpi4py import MPI

    from memdiag import ports

    with ports.hold_free_port() as port:
        try:
            address, how = ports.own_address()
            mine: tuple[str | None, int, str] = (address, port, how)
        except ValueError as exc:
            mine = (None, port, str(exc))
        everyone = MPI.COMM_WORLD.allgather(mine)
    if len(everyone) != size:
        raise ValueError(f"MPI has {len(everyone)} rank(s), the job {size}")
    failed = [(r, how) for r, (address, _, how) in enumerate(everyone) if address is None]
    if failed:
        r, reason = failed[0]
        raise ValueError(f"rank {r}: {reason}")
    workers = [f"[{a}]:{p}" if ":" in str(a) else f"{a}:{p}" for a, p, _ in everyone]
    if len(set(workers)) != size:
        raise ValueError(f"the workers chose the same address and port twice ({', '.join(workers)}): set "
                         f"{ports.ADDRESS_ENV} to an address on the network the workers share")
    return workers, {"ports_by": "ranks", "address": everyone[rank][0], "port": everyone[rank][1],
                     "address_from": everyone[rank][2]}


def run(config: AgentConfig, tracer: Tracer, writer: RecordWriter, rank: int, spool: str,
        tf_config: dict[str, Any]) -> None:
    """A script using tf.distribute.MultiWorkerMirroredStrategy, run as written (``--mode`` aside), or
    a built-in workload's strategy variant: no Horovod is imported; the start record is written when
    the strategy is up. A built-in workload's rank and size are MPI's, its warm-up agreed over MPI,
    and it saves its own parameters (after ``--steps``, whatever the warm-up adds)."""
    # The policy agrees every worker's rows over MPI (memdiag's own exchange on a communicator of its
    # own, made from the thread that traces or runs the step): MPI initialised, and the communicator
    # made, in the main thread, at mpi4py's MPI_THREAD_MULTIPLE, at the same point on every worker.
    from memdiag.agent.hooks_tf import StrategyHooks

    ranks = agreement.Agreement(agreement.MPITransport(), until=config.agree_until)

    hooks = StrategyHooks(
        tracer,
        mode=config.mode,
        margin=config.margin,
        world_size=world_size_from_env,
        on_decision=lambda d: writer.add(d.as_record(step=tracer.step)),
        initial_parameters=os.path.join(spool, rundir.INITIAL_PARAMETERS) if rank == 0 else None,
        fault=config.fault,
        check_reduction=config.check_reduction,
        agreement=ranks,
    )

    def started(extended: Any) -> None:
        task = int(extended._task_id)
        if task != rank:
            raise RuntimeError(f"MultiWorkerMirroredStrategy worker {task} runs on MPI rank {rank}")
        writer.write_now(_start_record(config, extended, tf_config))

    hooks.on_strategy = started
    hooks.install()
    try:
        if config.is_script:
            run_script(config)
        else:
            run_builtin(config, tracer, spool, hooks, rank, world_size_from_env(), agreement=ranks)
    finally:
        hooks.uninstall()
    if config.is_script:
        hooks._guard("end the last step", tracer.finish)
        hooks.record_final(os.path.join(spool, rundir.PARAMETERS) if rank == 0 else None)
    else:
        tracer.finish()


def _start_record(config: AgentConfig, extended: Any, tf_config: dict[str, Any]) -> StartRecord:
    import tensorflow as tf

    versions: dict[str, str | None] = {"python": platform.python_version(), "tensorflow": tf.__version__}
    for package in ("keras", "mpi4py"):
        try:
            versions[package] = __import__(package).__version__
        except Exception:  # noqa: BLE001 - versions are informative only
            versions[package] = None
    versions["mpi"] = mpi_version()
    current = os.environ.get("TF_CONFIG")
    source = tf_config.get("source")
    if source == "memdiag" and current != tf_config.get("value"):
        source = "script"  # the script wrote its own before building the strategy
    return StartRecord(
        type="start",
        format=RECORDS_FORMAT,
        engine=config.engine,
        size=int(extended._num_workers),
        local_size=ranks_on_node(),
        host=socket.gethostname(),
        pid=os.getpid(),
        mode=config.mode,
        versions=versions,
        cpu_count=os.cpu_count(),
        cpus_allowed=cpus_allowed(),
        tf_config={"source": source, "value": current,
                      # who chose the ports: the launcher (one host), or each rank (--hosts: its own
                      # address, how it found it, and its port)
                      **({key: tf_config[key] for key in ("ports_by", "address", "port", "address_from")
                          if key in tf_config} if source == "memdiag" else {})},
    )
