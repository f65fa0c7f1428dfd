"""``memdiag collect DIR [SPOOL ...]``: complete a run directory that its launcher could not complete.

- ``SPOOL``: node-local spool folders of ``--spool local`` (``memdiag-RUNID-rankK``, left on a node when
  its ranks were killed before they could hand their files on), copied from the nodes: what they hold
  beyond what reached DIR is added to it.
- A run still ``running`` whose launcher is gone (``memdiag run`` or every ``memdiag agent`` killed with
  SIGKILL, a node lost) is marked "ended without a word from its launcher", with where each rank
  stopped, and its summary written; a finished run has its summary written again from its records.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
from typing import Any

from memdiag._errors import UserError
from memdiag.format import rundir
from memdiag.format.manifest import RunManifest, read_manifest


class CollectCommand:
    help = "complete a run directory: merge node-local spools, and end a run whose launcher was killed"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run_dir", help="the run directory (memdiag run --out, memdiag agent --out)")
        parser.add_argument("spools", nargs="*", metavar="SPOOL",
                            help="node-local spool folders (memdiag-RUNID-rankK) copied from the nodes")

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int:
        from memdiag.launch import foreign, session

        out = args.run_dir
        if rundir.kind(out) != rundir.RUN:
            raise UserError(f"{out} is not a memdiag run directory (no {rundir.RUN_MANIFEST}); give the --out of "
                            "memdiag run or memdiag agent")
        manifest = read_manifest(out)
        for spool in args.spools:
            merged = merge_spool(spool, out, str(manifest.get("run_id")))
            print(f"{spool}: {merged} file(s) added to or extended in {out}")
        agents = os.path.isdir(os.path.join(out, foreign.AGENTS_DIR))
        if manifest.get("status") == "running":
            alive = foreign.unfinished_agents_alive(out) if agents else launcher_alive(manifest)
            if alive:
                raise UserError(f"{out} is still being written (pid {', '.join(map(str, alive))} on this host): "
                                "wait for the run to end")
            if agents:
                codes = foreign.exit_codes(out)
                foreign.conclude_agents(out, codes, unfinished=len(codes) < int(manifest.get("world_size") or 0))
            else:
                session.conclude(out, manifest, returncode=None, timed_out=False, wall_s=None,
                                 command=manifest.get("command"), unfinished=True)
        else:
            from memdiag.format.reader import load_run

            session.write_summary(load_run(out))
        status = read_manifest(out).get("status")
        print(f"{out}: status {status}")
        return 0


def launcher_alive(manifest: RunManifest) -> list[int]:
    """``memdiag run``'s own pid, when it runs on this host still."""
    pid = manifest.get("launcher_pid")
    if isinstance(pid, int) and manifest.get("launcher_host") == socket.gethostname() and os.path.exists(f"/proc/{pid}"):
        return [pid]
    return []


def ended_without_word(out: str, run: Any) -> str | None:
    """The status of a run still ``running`` whose launcher is gone (what ``collect`` would mark it),
    or None: the run is finished, or still being written on this host."""
    from memdiag.launch import foreign, session

    if run.manifest.get("status") != "running":
        return None
    agents = os.path.isdir(os.path.join(out, foreign.AGENTS_DIR))
    if foreign.unfinished_agents_alive(out) if agents else launcher_alive(run.manifest):
        return None
    stopped = {rank: session.stopped_at(records) for rank, records in run.ranks.items()}
    return "ended without a word from its launcher; " + session.where_ranks_stopped(
        stopped, int(run.manifest.get("world_size") or 0))


def merge_spool(spool: str, out: str, run_id: str) -> int:
    """Add what a copied spool folder holds beyond DIR's files: the rest of each record file (they are
    append-only, so DIR holds a prefix of each), and any other file DIR lacks. Returns the files touched."""
    name = os.path.basename(os.path.normpath(spool))
    if not os.path.isdir(spool):
        raise UserError(f"{spool} is not a directory; give the spool folders (memdiag-RUNID-rankK) copied from the nodes")
    if not name.startswith(f"memdiag-{run_id}-rank"):
        raise UserError(f"{spool} is not a spool of this run (its folder is named memdiag-{run_id}-rankK)")
    touched = 0
    for file in sorted(os.listdir(spool)):
        source, target = os.path.join(spool, file), os.path.join(out, file)
        if not os.path.isfile(source):
            continue
        have = os.path.getsize(target) if os.path.exists(target) else 0
        size = os.path.getsize(source)
        if file.endswith(".jsonl") and size > have:
            with open(source, "rb") as src, open(target, "ab") as dst:
                src.seek(have)
                shutil.copyfileobj(src, dst)
            touched += 1
        elif not os.path.exists(target):
            shutil.copy2(source, target)
            touched += 1
    return touched
