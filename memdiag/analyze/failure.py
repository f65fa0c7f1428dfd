"""What went wrong in a run that did not finish: a rank killed for memory, a hang, an error."""

from __future__ import annotations

import re

from memdiag.format import rundir
from memdiag.format.reader import RankRecords, Run
from memdiag.format.records import WaitingRecord
from memdiag.format.results import FailureSummary, LastCollective
from memdiag.units import format_bytes

# Horovod's stall inspector (HOROVOD_STALL_CHECK_TIME_SECONDS) names, per rank, the tensors that the
# other ranks submitted and that rank did not: "Missing ranks:" then lines "1: [name, name]".
_MISSING_RANKS = re.compile(r"Missing ranks:\s*\n((?:\s*\d+: \[[^\]]*\]\s*\n?)+)")
_RANK_LINE = re.compile(r"(\d+): \[([^\]]*)\]")


def stalled_collectives(log: str) -> dict[int, list[str]]:
    """From the last stall warning in the log: rank -> tensors it never submitted."""
    blocks = _MISSING_RANKS.findall(log)
    if not blocks:
        return {}
    return {int(rank): [n.strip() for n in names.split(",") if n.strip()]
            for rank, names in _RANK_LINE.findall(blocks[-1])}


def last_collective(run: Run, rank: int) -> LastCollective | None:
    records = run.ranks.get(rank)
    if records is None or not records.collectives:
        return None
    c = records.collectives[-1]
    return {"step": c.get("step"), "op": c["op"], "name": c["name"], "bytes_out": c["bytes_out"]}


def still_waiting(records: RankRecords) -> WaitingRecord | None:
    """The rank's last wait record, unless that collective completed after it (a slow collective on a
    loaded machine is recorded as a wait, and is not a hang once it completes)."""
    if not records.waiting:
        return None
    wait = records.waiting[-1]
    key = (wait.get("op"), wait.get("name"), wait.get("part"))
    since = wait.get("since", wait.get("t", 0.0))
    for c in records.collectives:
        if (c.get("op"), c.get("name"), c.get("part")) == key and c.get("t", 0.0) >= since:
            return None
    return wait


def diagnose(run: Run) -> FailureSummary | None:
    """One headline and the facts behind it, or None when the run finished."""
    m = run.manifest
    killed = {rank: r.killed for rank, r in run.ranks.items() if r.killed}
    if killed:
        rank, record = min(killed.items())
        flight = record.get("in_flight")
        collective = (f"in {flight['op']} of {flight['name']}"
                      + (f" [{flight['part']}]" if flight.get("part") else "")
                      + (f", {format_bytes(flight['bytes_out'])} out" if flight.get("bytes_out") else "")
                      + (f", {flight['others_in_flight']} other collective(s) in flight"
                         if flight.get("others_in_flight") else "")
                      ) if flight else "with no collective in flight"
        received = record.get("received_this_step") or []
        if received:
            collective += "; largest received this step: " + ", ".join(
                f"{r['op']} of {r['name']}" + (f" [{r['part']}]" if r.get("part") else "")
                + f" ({format_bytes(r['bytes_out'])})" for r in received)
        return {
            "kind": "mem-limit",
            "headline": f"rank {rank} killed at step {record['step']} by the memory limit "
                        f"(RSS {format_bytes(record['rss_bytes'])} > {format_bytes(record['limit_bytes'])}, "
                        f"peak {format_bytes(record.get('hwm_bytes'))}), {collective}",
            "killed_ranks": {str(k): v for k, v in killed.items()},
        }
    if m.get("timed_out"):
        missing = stalled_collectives(run.log)
        size = m.get("world_size") or 0
        waits = {rank: wait for rank, r in run.ranks.items() if (wait := still_waiting(r)) is not None}
        waiting = sorted(waits) if waits else [r for r in range(size) if r not in missing]
        if missing or waits:
            # Horovod names eager collectives generically; memdiag's own wait records keep the name.
            names = sorted({w["name"] for w in waits.values()} or {n for ns in missing.values() for n in ns})
            absent = sorted(missing) or [r for r in range(size) if r not in waits]
            headline = (f"hang: rank(s) {', '.join(map(str, waiting))} waited in {', '.join(names)}; "
                        f"rank(s) {', '.join(map(str, absent))} never joined it")
        else:
            headline = ("the job ran past --timeout and was ended; no Horovod stall report was seen "
                        "(ranks may have been computing, or stuck outside collectives)")
        return {
            "kind": "timeout",
            "headline": headline,
            "missing": {str(k): v for k, v in missing.items()},
            "waiting_ranks": waiting,
            "waiting_in": {str(k): v for k, v in waits.items()},
            "last_collective": {str(r): last_collective(run, r) for r in range(size)},
        }
    ended = {rank: r.end for rank, r in run.ranks.items() if r.end and r.end.get("status") != "ok"}
    errors = {rank: end.get("error") for rank, end in ended.items()}
    dead = sorted(rank for rank, r in run.ranks.items() if r.end is None)
    terminated = all(end.get("status") == "terminated" for end in ended.values())
    if dead and errors and terminated and not m.get("terminated_by"):
        # A rank killed outright (the OOM killer, kill -9) leaves no record of why; the launcher then
        # terminates the others, whose records say only that: the dead rank is the cause.
        return {"kind": "died", "headline": f"rank(s) {', '.join(map(str, dead))} ended without a record of why "
                                            f"(killed by a signal?), and the launcher then terminated the others; "
                                            f"see {rundir.MPIRUN_LOG}"}
    if errors:
        # memdiag's own diagnosis first: a rank that could not agree with the others names the cause,
        # which the others only see as a collective that failed or Horovod shut down.
        agreeing = {r: e for r, e in errors.items() if e and "AgreementError" in e}
        rank, error = min((agreeing or errors).items())
        last_line = error.strip().splitlines()[-1].strip() if error and error.strip() else "unknown error"
        return {"kind": "error", "headline": f"rank {rank} failed: {last_line}"}
    if m.get("status") not in (None, "ok", "running"):
        dead = [rank for rank, r in run.ranks.items() if r.end is None]
        return {"kind": "died", "headline": f"rank(s) {', '.join(map(str, dead)) or '?'} ended without a "
                                            f"record of why (killed by a signal?); see {rundir.MPIRUN_LOG}"}
    return None
