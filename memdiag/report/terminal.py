"""The run report drawn with rich: header, per-rank table, per-tensor collective table.

Tables are :class:`memdiag.report._fit.FitTable`: figures are never cut, tensor names are shortened
from the left to the width the console leaves them.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from memdiag.format.manifest import RunManifest
from memdiag.format.results import (
    CollectiveSummary,
    DistinctRowsSummary,
    ModeApplied,
    PolicySummary,
    RankSummary,
    RunSummary,
)
from memdiag.report._fit import Column, FitTable
from memdiag.units import format_bytes

MAX_TENSOR_ROWS = 12


_MEMORY_SETTINGS = {
    "TF_ENABLE_ONEDNN_OPTS": "oneDNN's kernels and its pooled CPU allocator; at 0 RSS follows the tensors alive",
    "TF_CPU_ALLOCATOR_USE_BFC": "TensorFlow's pooled CPU allocator",
    "MALLOC_ARENA_MAX": "glibc's malloc arenas",
    "MALLOC_MMAP_THRESHOLD_": "glibc's mmap threshold",
    "MALLOC_TRIM_THRESHOLD_": "glibc's trim threshold",
    "LD_PRELOAD": "a preloaded library, such as another allocator",
}


def describe_memory_environment(settings: dict[str, str]) -> list[str]:
    """The memory settings the user's environment gave the ranks (run.json's ``memory_environment``),
    one phrase each: ``NAME=VALUE (what it governs)``."""
    return [f"{name}={value} ({_MEMORY_SETTINGS.get(name, 'memory allocation')})" for name, value in settings.items()]


def run_header(summary: RunSummary, manifest: RunManifest) -> Panel:
    versions = manifest.get("versions") or {}
    target = summary.get("workload") or "?"
    if summary.get("preset"):
        target += f" ({summary['preset']})"
    lines = Text()
    lines.append(f"{target}", style="bold")
    lines.append(f"  mode {summary.get('mode')}  ranks {summary.get('world_size')}  "
                 f"steps {summary.get('steps_recorded')}")
    status = summary.get("status") or manifest.get("status")
    lines.append(f"  status {status}", style="green" if status == "ok" else "bold red")
    if manifest.get("wall_s") is not None:
        lines.append(f"  wall {manifest['wall_s']:.1f} s")
    mpi = (versions.get("mpi") or "").split(",")[0].replace("\x00", "")
    if manifest.get("engine", "horovod") != "horovod":
        lines.append(f"\nengine {manifest['engine']}")
        if versions:
            lines.append(f"  TensorFlow {versions.get('tensorflow')}  Keras {versions.get('keras')}  {mpi}")
    elif versions:
        lines.append("\nTensorFlow {tensorflow}  Horovod {horovod}  {mpi}".format(
            tensorflow=versions.get("tensorflow"), horovod=versions.get("horovod"), mpi=mpi))
    binding = binding_line(summary)
    if binding:
        lines.append("\n" + binding)
    if summary.get("oversubscribed"):
        lines.append("\nranks share cores on this host: step times are not a scaling measurement",
                     style="yellow")
    return Panel(lines, title="memdiag run", expand=False)


def binding_line(summary: RunSummary) -> str | None:
    """Where the launcher let the ranks run, when it bound them to fewer CPUs than their host has (as a
    plain ``mpirun -np N`` does while the ranks fit the cores): TensorFlow sizes its default thread pools
    by those CPUs, so a run bound differently is a different job. None: unbound, or not recorded."""
    found = [(cpus, count) for r in summary["ranks"]
             if isinstance(cpus := r.get("cpus_allowed"), int) and isinstance(count := r.get("cpu_count"), int)]
    if not found or all(a >= c for a, c in found):
        return None
    allowed = sorted({a for a, _ in found})
    counts = sorted({c for _, c in found})
    span = str(allowed[0]) if len(allowed) == 1 else f"{allowed[0]}-{allowed[-1]}"
    host = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    return (f"ranks bound by the launcher: each could run on {span} of its host's {host} CPUs, and TensorFlow "
            "sized its default thread pools by them")


def rank_table(summary: RunSummary) -> FitTable:
    table = FitTable([Column("rank", key=True), Column("status", justify="left"), Column("peak RSS"),
                      Column("VmHWM"), Column("gathered"), Column("reduced"), Column("step time")],
                     title="Per rank (collective bytes per step)")
    for r in summary["ranks"]:
        table.add_row(
            str(r["rank"]),
            r["status"],
            format_bytes(r["peak_rss_bytes"]),
            format_bytes(r["hwm_bytes"]),
            format_bytes(r["allgather_bytes_per_step"]),
            format_bytes(r["allreduce_bytes_per_step"]),
            "-" if r["step_time_s"] is None else f"{r['step_time_s'] * 1000:.1f} ms",
        )
    return table


def short_name(name: str, scope: str = "") -> str:
    """A tensor name without the scope every tensor shares and without the output index."""
    name = name[:-2] if name.endswith(":0") else name
    return name[len(scope):] if scope and name.startswith(scope) else name


def common_scope(names: list[str]) -> str:
    """The leading ``scope/`` shared by all names (the model's name), or ''."""
    heads = {n.split("/", 1)[0] for n in names if "/" in n}
    if len(heads) == 1 and all("/" in n for n in names):
        return heads.pop() + "/"
    return ""


def _collective(entry: CollectiveSummary) -> str:
    """The collective that reduced the tensor; "densified" is an IndexedSlices gradient that memdiag
    (or the script's sparse_as_dense) turned dense and allreduced. An IndexedSlices gradient that
    was gathered shows as allgather of its [values] and [indices]; "merged allgather" when its
    duplicate rows were summed first (dedup)."""
    return "densified" if entry["densified"] else ("merged allgather" if entry.get("merged") else entry["op"])


REDUCED_AS = {"dense": "dense allreduce", "dedup": "merge + allgather", "sparse": "allgather"}


def tensor_table(summary: RunSummary, limit: int = MAX_TENSOR_ROWS) -> FitTable:
    """Bytes received per rank per call; what one rank sends follows from the rows (in > out), so
    the column is left out to leave the tensor names room."""
    entries = summary["collectives"]
    shown = entries[:limit]
    scope = common_scope([e["name"] for e in entries])
    table = FitTable([Column("tensor", kind="name", justify="left", key=True),
                      Column("collective", justify="left"), Column("rows in>out"), Column("received")],
                     title="Collectives per tensor (largest first, bytes received per rank per call)")
    for e in shown:
        name = short_name(e["name"], scope) + (f" [{e['part']}]" if e["part"] else "")
        rows = "" if e["rows_in"] is None else f"{e['rows_in']}>{e['rows_out']}"
        table.add_row(name, _collective(e), rows, format_bytes(e["bytes_out_per_rank"]))
    if len(entries) > limit:
        rest = entries[limit:]
        table.add_row(f"... {len(rest)} more", "", "", format_bytes(sum(e["bytes_out_per_rank"] for e in rest)))
    return table


def policy_table(summary: RunSummary) -> FitTable | None:
    if not summary.get("policy"):
        return None
    table = FitTable([Column("tensor", kind="name", justify="left", key=True),
                      Column("reduced as", justify="left"), Column("reason", kind="prose", justify="left")],
                     title="IndexedSlices gradients: reduction chosen")
    scope = common_scope([p["name"] for p in summary["policy"]])
    for p in summary["policy"]:
        reduced_as = REDUCED_AS.get(p["decision"], p["decision"])
        if p.get("optimizer_input") == "dense":
            reduced_as += ", dense to the optimizer"
        table.add_row(short_name(p["name"], scope), reduced_as, Text(p["reason"]))
    return table


def padding_table(summary: RunSummary) -> FitTable | None:
    """tf-distribute: MultiWorkerMirroredStrategy pads each worker's rows to the longest's before
    gathering; what each worker receives of zero rows, per tensor whose rows differ."""
    entries = summary.get("padding") or []
    if not entries:
        return None
    table = FitTable([Column("tensor", kind="name", justify="left", key=True), Column("rows/worker"),
                      Column("gathered"), Column("padding"), Column("share")],
                     title="Padded gathers (MultiWorkerMirroredStrategy, per worker per step)")
    scope = common_scope([e["name"] for e in entries])
    for e in entries:
        rows = e.get("rows_per_worker") or []  # (tolerant: summaries written before a field are read too)
        span = "" if not rows else (str(rows[0]) if min(rows) == max(rows) else f"{min(rows)}-{max(rows)}")
        padding_share = e.get("padding_share")
        share = "" if padding_share is None else f"{100 * padding_share:.0f}%"
        table.add_row(short_name(e["name"], scope), span, format_bytes(e["gathered_bytes_per_step"]),
                      format_bytes(e["padding_bytes_per_step"]), share)
    return table


def footer(summary: RunSummary) -> Text:
    text = Text()
    failure = summary.get("failure")
    if failure:
        text.append(failure["headline"] + "\n", style="bold red")
    consistency = summary.get("consistency")
    if consistency and consistency["checked_steps"]:
        if consistency["ranks_identical"]:
            text.append(f"parameters identical on all ranks at each of {consistency['checked_steps']} steps\n",
                        style="green")
        else:
            text.append(f"parameters DIFFER between ranks at steps {consistency['mismatched_steps']}\n",
                        style="bold red")
    if summary.get("throughput_items_per_s"):
        text.append(f"throughput {summary['throughput_items_per_s']:.0f} items/s (all ranks)\n")
    for r in summary["ranks"]:
        error = r.get("error")
        if error and not (failure and failure["kind"] == "error" and f"rank {r['rank']} " in failure["headline"]):
            last_line = error.strip().splitlines()[-1].strip()
            when = "before its first step" if r["last_step"] is None else f"after step {r['last_step']}"
            text.append(f"rank {r['rank']} failed {when}: {last_line}\n", style="red")
    for own in (sampler_cost_line(summary), own_memory_line(summary), replayed_line(summary)):
        if own:
            text.append(own + "\n", style="dim")
    for warning in summary.get("warnings", []):
        text.append(f"warning: {warning}\n", style="yellow")
    return text


def sampler_cost_line(summary: RunSummary) -> str | None:
    """memdiag's own cost, as the ranks measured it: the CPU its sampling thread used on the rank where
    that was the largest share of the rank's time (None when no rank says)."""
    shares = [(cpu / wall, cpu, wall, r["rank"]) for r in summary["ranks"]
              if isinstance(cpu := r.get("sampler_cpu_s"), (int, float)) and (wall := r.get("agent_wall_s") or 0) > 0]
    if not shares:
        return None
    share, cpu, wall, rank = max(shares, key=lambda found: found[0])
    line = (f"memdiag's sampling thread used {cpu:.2f} s of CPU on rank {rank} "
            f"({100 * share:.1f}% of a core over its {wall:.1f} s; --sample-ms sets how often it wakes)")
    every = max((r.get("record_every_s") or 0.0 for r in summary["ranks"]), default=0.0)
    if every:
        line += f"; marks made records every {every:g} s (--record-every)"
        # a built-in workload's steps drain the marks themselves; a script's marks wait in a file, unless
        # they could not (--spool local: the file would stay on the node)
        if summary.get("script") and not all(r.get("marks_file") for r in summary["ranks"] if r.get("record_every_s")):
            line += f", so a rank killed outright could lose up to {every:g} s of records"
    return line


def own_memory_line(summary: RunSummary) -> str | None:
    """What memdiag itself keeps resident in a rank, as the ranks measured it: RSS grown by its set-up
    (from the job's TensorFlow and Horovod import to the hand-over to the script, before step 0, so in
    no step's figures), the native marks' ring within it, and the mark ops it added to the graphs (the
    largest count of a rank), whose memory is inside the steps' figures and is not measured per run (None
    when no rank says)."""
    work = own_work_clause(summary)
    measured = [(r["own_setup_rss_bytes"], r["rank"], r.get("marks_ring_bytes") or 0) for r in summary["ranks"]
                if isinstance(r.get("own_setup_rss_bytes"), int)]
    if not measured:
        return f"memdiag's {work}" if work else None
    setup, rank, ring = max(measured)
    line = (f"memdiag's own set-up grew RSS by {format_bytes(setup)} on rank {rank} (the largest; before step 0, "
            f"in no step's figures)")
    if ring:
        line += f", {format_bytes(ring)} of it the native marks' ring"
    ops = max((r.get("mark_ops") or 0 for r in summary["ranks"]), default=0)
    if ops:
        line += f"; it added {ops} mark ops to the job's graphs (at most two per collective in each graph traced)"
        each = max((r.get("mark_op_heap_bytes") or 0 for r in summary["ranks"]), default=0)
        resident = max((r.get("mark_op_resident_bytes") or 0 for r in summary["ranks"]), default=0)
        if each:
            line += f", about {format_bytes(ops * each)} of heap at {format_bytes(each)} each"
            if resident:
                line += (f" and {format_bytes(ops * resident)} resident at {format_bytes(resident)} each (a mark "
                         "op's heap and resident memory as measured when memdiag's native marks were built for "
                         "this TensorFlow, not in this run)")
            else:
                line += (" (a mark op's heap as measured when memdiag's native marks were built for this "
                         "TensorFlow, not in this run; the resident memory they cost is more, with the "
                         "allocator's slack)")
            line += ("; made when a step is traced, they are in the level of every step after it "
                     "(docs/explanation/overhead.md)")
        else:
            line += (", whose memory is in the steps' figures and not measured (docs/explanation/overhead.md; "
                     "python -m memdiag.nativemarks build measures a mark op's)")
    shared = max((r.get("begins_shared") or 0 for r in summary["ranks"]), default=0)
    if shared:
        line += (f"; {shared} all-reduces of under 64 KiB (counted in each graph traced) began with their graph's "
                 "one shared begin mark, so their records start when the last of them was ready")
    if work:
        line += f"; its {work}"
    return line


def own_work_clause(summary: RunSummary) -> str | None:
    """memdiag's own work on the ranks (reading and saving parameters, a step's hooks), cut out of the
    steps' figures: the most RSS rose above where one of its spans began, on the rank where it rose
    most, with that rank's spans and seconds (None when no rank wrote one)."""
    found = [(rise, r["rank"], r.get("own_work_spans") or 0, r.get("own_work_s") or 0.0) for r in summary["ranks"]
             if isinstance(rise := r.get("own_work_rise_bytes"), int)]
    if not found:
        return None
    rise, rank, spans, seconds = max(found, key=lambda f: (f[0], -f[1]))
    return (f"own work (reading, hashing and saving parameters: {spans} span{'s' if spans != 1 else ''}, {seconds:.2f} s on "
            f"rank {rank}) rose RSS by at most {format_bytes(rise)} above where it began, cut out of the steps' "
            "figures")


def replayed_line(summary: RunSummary) -> str | None:
    """The steps of ranks killed outright that memdiag made from the marks they left (None: none)."""
    replayed = [f"rank {r['rank']} steps {steps[0]}-{steps[1]}" for r in summary["ranks"]
                if isinstance(steps := r.get("replayed_steps"), list) and len(steps) == 2]
    if not replayed:
        return None
    return (f"made from the marks left by ranks killed outright: {', '.join(replayed)} (sampled peaks: "
            "no high-water mark of their own)")


def second_figure(one: float, every: float) -> bool:
    """Whether the live model's all-at-once figure ``every`` is worth showing beside its one-at-a-time figure
    ``one``: more than 1% (and a byte) larger, as with more than one gathered tensor."""
    return every > one * 1.01 and every - one >= 1


# What the live collective figure assumes (memdiag.analyze.live_bytes.LiveStep): it is not a measurement.
LIVE_ASSUMPTION = ("every output but an allgather's alive until the update, one allgather (a grouped call's "
                   "together) and one quotient at a time")


def rows_text(summary: RunSummary) -> Text:
    """Per IndexedSlices gradient whose ranks' rows differ: every rank's own rows, what the allgather
    gathered per step (their sum) and the formula's bytes for it."""
    text = Text()
    scope = common_scope([p["name"] for p in summary.get("policy", [])])
    for p in summary.get("policy", []):
        own = p.get("own_rows_by_rank") or {}
        varying = p.get("own_rows_range")
        if varying:
            gathered = p.get("gathered_rows_range")
            text.append(f"{short_name(p['name'], scope)}: rows change from step to step: a rank's own "
                        f"{_range(varying)}" + (f", gathered {_range(gathered)}" if gathered else "")
                        + "; the formula and predictions use the most\n")
        if len(set(own.values())) <= 1:
            continue
        rows = ", ".join(f"rank {r}: {n}" for r, n in own.items())
        most = "the most of any step: " if varying else ""
        text.append(f"{short_name(p['name'], scope)}: rows differ between ranks ({most}{rows}); gathered per step: "
                    f"{p.get('rows_gathered')} rows, {format_bytes(p.get('formula_gathered_bytes'))} by the formula\n")
    return text


def _range(rows: list[int]) -> str:
    """[least, median, most] in words."""
    return f"{rows[0]} to {rows[2]} (median {rows[1]})"


def memory_text(summary: RunSummary) -> Text:
    """The steady-state peak in words, and which phase set it (docs/explanation/measurement.md)."""
    text = Text()
    ranks = [r for r in summary["ranks"] if r.get("steady_peak_rss_bytes")]
    if not ranks:
        return text
    top = max(ranks, key=lambda r: r["steady_peak_rss_bytes"] or 0)
    if top["steady"]:
        text.append(f"peak RSS {format_bytes(top['steady_peak_rss_bytes'])} (rank {top['rank']}), steady from step "
                    f"{top['steady_from_step']}; first step {format_bytes(top['first_step_peak_rss_bytes'])}. ")
    else:
        text.append(f"peak RSS {format_bytes(top['steady_peak_rss_bytes'])} (rank {top['rank']}) NOT steady: the "
                    "per-step peaks of its last steps rose, or swung, by more than 1%; run more steps (--steps). ",
                    style="yellow")
    tails = [r for r in ranks if (r.get("tail_peak_rss_bytes") or 0) > (r["steady_peak_rss_bytes"] or 0)]
    if tails:
        last = max(tails, key=lambda r: r["tail_peak_rss_bytes"] or 0)
        text.append(f"After its last step the script reached {format_bytes(last['tail_peak_rss_bytes'])} "
                    f"(rank {last['rank']}: its own work after the loop, left out of the steady state). ")
    if top.get("collective_rise_bytes") is None or top["peak_phase"] is None:
        return text
    if top["collective_peak_rss_bytes"] is None and not top["collective_rise_bytes"]:
        text.append("No gradient reduction ran: compute set the peak.\n")
        return text
    text.append(peak_cause(top, summary.get("attribution")) + "\n")
    return text


def peak_cause(top: RankSummary, attribution: dict[str, Any] | None = None) -> str:
    """What set a rank's steady peak, by what is held at it (memdiag.analyze.steady.held_phase), then when
    RSS grew, which is not the same thing; with ``attribution`` (memray's groups at the rank's peak), what
    Horovod's buffers held there, measured."""
    compute, peak = top["compute_peak_rss_bytes"], top["steady_peak_rss_bytes"]
    held, added = top.get("collective_live_peak_bytes"), top.get("collective_added_peak_bytes")
    when = (f"RSS grew {format_bytes(top['collective_rise_bytes'])} while collectives ran and "
            f"{format_bytes(top['compute_rise_bytes'])} outside them")
    measured = _horovod_at_peak(attribution, top["rank"])
    if held is None or added is None or compute is None or peak is None:
        setter = "the collectives (gathered and reduced buffers)" if top["peak_phase"] == "collectives" \
            else "compute (model, activations, graph)"
        return (f"Set by {setter}, by when RSS grew (no record of the collectives' outputs): RSS was "
                f"{format_bytes(compute)} when the first gradient reduction started; {when}.{measured}")
    model = (f"modelled from the records: {LIVE_ASSUMPTION}; Horovod's fusion buffer, up to "
             "HOROVOD_FUSION_THRESHOLD (128 MiB by default), is not in the model"
             + ("" if measured else ": --memray measures it"))
    every = top.get("collective_live_all_peak_bytes")
    if every is not None and second_figure(held, every):
        held_text = (f"{format_bytes(held)} of collective outputs in all, {format_bytes(every)} if every gathered "
                     "tensor's outputs and quotient were alive at once")
    else:
        held_text = f"{format_bytes(held)} of collective outputs in all"
    if top["peak_phase"] == "collectives":
        return (f"Set by the collectives (gathered buffers): the gathered outputs and quotient alive at once add "
                f"{format_bytes(added)} to the {format_bytes(peak - added)} the step holds besides "
                f"({held_text}; {model}). RSS was {format_bytes(compute)} "
                f"when the first gradient reduction started; {when}.{measured}")
    return (f"Set by compute (the backward pass, activations, model); collectives held {format_bytes(held)} of "
            f"it, of which {format_bytes(added)} beyond the gradients they replace ({model}). RSS was "
            f"{format_bytes(compute)} when the first gradient reduction started; {when}: reductions that "
            f"overlap the backward pass share its time, not its memory.{measured}")


def _horovod_at_peak(attribution: dict[str, Any] | None, rank: int) -> str:
    """memray's figure of what Horovod's buffers held at ``rank``'s peak, as a sentence ('' without it)."""
    from memdiag.analyze.attribution import ALLGATHER, ALLREDUCE

    found = next((r for r in (attribution or {}).get("ranks", []) if r.get("rank") == rank), None)
    if found is None:
        return ""
    groups = {g["group"]: g["bytes"] for g in found.get("groups", [])}
    return (f" memray at this rank's peak: Horovod's allgather outputs {format_bytes(groups.get(ALLGATHER, 0))}, its "
            f"allreduce and fusion buffers {format_bytes(groups.get(ALLREDUCE, 0))} (allocated, of "
            f"{format_bytes(found['peak_bytes'])} memray saw).")


_REDUCTION_WORDS = {"sparse": "an allgather", "dense": "a dense allreduce", "dedup": "a merged allgather"}


def describe_mode_applied(applied: ModeApplied) -> list[str]:
    """The report's lines: what the mode changed, as the records show it, then each gradient it did not."""
    mode, names, done = applied["mode"], applied["gradients"], applied["applied"]
    lines = []
    if not names and not applied["unlabelled"]:
        lines.append(f"--mode {mode}: the records show no IndexedSlices gradient, so it changed no reduction")
    elif len(done) == len(names) and not applied["unlabelled"]:
        how = "as its decisions chose" if mode == "auto" else f"as {mode} says"
        lines.append(f"--mode {mode}: {len(done)} IndexedSlices gradient(s) reduced {how} (their records show it), "
                     "whatever the script's sparse_as_dense")
    else:
        lines.append(f"--mode {mode}: applied to {len(done)} of {len(names)} IndexedSlices gradient(s) the records "
                     "show; not to the others, which went to Horovod as the script asked")
    for miss in applied["not_applied"]:
        shown = " and ".join(_REDUCTION_WORDS.get(r, r) for r in miss["recorded"]) or "no reduction"
        chosen = _REDUCTION_WORDS.get(miss["expected"], miss["expected"])
        lines.append(f"--mode {mode} NOT applied to {miss['name']}: its records show {shown}, not {chosen} "
                     f"({miss['why']})")
    if applied["unlabelled"]:
        lines.append(f"--mode {mode} NOT applied to {len(applied['unlabelled'])} allgather(s) memdiag could not tie "
                     f"to a variable: {', '.join(applied['unlabelled'][:4])}"
                     + (" ..." if len(applied["unlabelled"]) > 4 else ""))
    return lines


def script_text(summary: RunSummary) -> Text:
    """What a script asked Horovod for, and what this run changed (nothing, as written)."""
    text = Text()
    asked = [c for c in summary.get("script_choices", []) if c.get("api") == "gradient reduction"]
    for c in asked:
        group = c.get("process_set") or {}
        parts = [f"sparse_as_dense={c.get('sparse_as_dense')}", f"op={c.get('op')}",
                 f"compression={c.get('compression')}"]
        if group.get("size") is not None:
            parts.append(f"process set of {group['size']} rank(s)")
        if c.get("groups"):
            parts.append(f"groups={c['groups'] if isinstance(c['groups'], int) else len(c['groups'])}")
        text.append("the script asked: " + ", ".join(parts) + "\n")
    for c in summary.get("script_choices", []):
        if c.get("backward_passes_per_step", 1) not in (None, 1):
            text.append(f"the script asked: backward_passes_per_step={c['backward_passes_per_step']}\n")
    for phrase in describe_memory_environment(summary.get("memory_environment") or {}):
        text.append(f"set in the environment: {phrase}\n", style="yellow")
    changes = summary.get("changes_to_job") or []
    applied = summary.get("mode_applied")
    if applied is not None:
        # What the mode did is what the records show (memdiag.analyze.mode_applied), not what was asked.
        lines = describe_mode_applied(applied)
        changes = [lines[0] if c.startswith(f"--mode {applied['mode']}:") else c for c in changes]
        missed = lines[1:]
    else:
        missed = []
    if summary.get("script"):
        if changes:
            for change in changes:
                text.append(f"changed by this run: {change}\n", style="yellow")
            for line in missed:
                text.append(f"{line}\n", style="bold red")
        else:
            text.append("measured as written: memdiag changed nothing in the job\n", style="green")
    for p in summary.get("policy", []):
        if p.get("overridden") and summary.get("engine") == "tf-distribute":
            # MultiWorkerMirroredStrategy has no sparse_as_dense: as written, it gathers padded rows.
            text.append(f"as written, MultiWorkerMirroredStrategy gathers {p['name']} (padded rows); "
                        f"this run used {p['decision']}\n", style="yellow")
        elif p.get("overridden"):
            text.append(f"the script asked for sparse_as_dense={p.get('script_sparse_as_dense')} for "
                        f"{p['name']}; this run used {p['decision']}\n", style="yellow")
    policies = {p["name"]: p for p in summary.get("policy", [])}
    for d in summary.get("distinct_rows", []):
        text.append(distinct_rows_line(d) + "\n")
        outgrown = guard_outgrown(d, policies.get(d["name"]))
        if outgrown:
            text.append(outgrown + "\n", style="yellow")
    return text


def guard_outgrown(d: DistinctRowsSummary, policy: PolicySummary | None) -> str | None:
    """auto decided from the first step's U times the guard: say so when a later U went beyond it."""
    from memdiag.policy import guarded_distinct_rows

    distinct, rows = (policy.get("distinct_rows"), policy.get("agreed_rows")) if policy else (None, None)
    if not policy or policy.get("mode") != "auto" or distinct is None or rows is None:
        return None
    planned = guarded_distinct_rows(distinct, rows, policy.get("dedup_guard") or 1.0)
    if d["distinct_rows_max"] <= planned:
        return None
    return (f"  {d['name']}: U reached {d['distinct_rows_max']}, beyond the {planned} rows auto planned for "
            f"(first step's {policy['distinct_rows']} x guard {policy.get('dedup_guard')}): its choice "
            f"({policy['decision']}) may no longer be the cheapest")


def distinct_rows_line(d: DistinctRowsSummary) -> str:
    """T and U of one IndexedSlices gradient over a run's ranks and steps, and the merge's cost."""
    low, high = d["distinct_rows_min"], d["distinct_rows_max"]
    line = (f"{d['name']}: {low}-{high} distinct of {d['rows_max']} rows per rank "
            f"(U/T {low / d['rows_max']:.2f}-{high / d['rows_max']:.2f}; first step's largest U "
            f"{d['first_step_distinct_rows_max']}, over {d['steps']} steps)" if d["rows_max"] else d["name"])
    merge_s = d.get("merge_s_median")
    if merge_s is not None:
        line += f"; merging took {merge_s * 1000:.2f} ms per step (median)"
    return line


def run_report(summary: RunSummary, manifest: RunManifest) -> Group:
    parts: list[Any] = [run_header(summary, manifest), script_text(summary), rank_table(summary),
                        tensor_table(summary), memory_text(summary)]
    policy = policy_table(summary)
    if policy is not None:
        parts.append(policy)
        parts.append(rows_text(summary))
    padding = padding_table(summary)
    if padding is not None:
        parts.append(padding)
    if summary.get("attribution"):
        from memdiag.report.attribution import attribution_section

        parts.append(attribution_section(summary["attribution"]))
    parts.append(footer(summary))
    return Group(*parts)


def print_run(summary: RunSummary, manifest: RunManifest, console: Console | None = None) -> None:
    (console or Console()).print(run_report(summary, manifest))
