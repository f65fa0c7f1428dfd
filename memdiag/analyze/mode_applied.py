"""Whether the mode a run asked for is the mode its records show, per IndexedSlices gradient.

A report names the reduction a run applied from its collective records, never from the option alone:
``--mode dense`` is applied to a gradient only where its records show a densified allreduce, ``sparse``
where they show an allgather of its rows, ``dedup`` a merged allgather, and ``auto`` whatever its
decision record chose. A gradient whose records show anything else is named with why (the agent's
``not_applied`` record, else its first bookkeeping failure); a gradient memdiag could not label at all
leaves allgathers named by their call site, which are listed while a labelling failure is recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from memdiag.format.results import CollectiveSummary, ModeApplied, NotApplied, PolicySummary
from memdiag.policy import AS_WRITTEN

# What each explicit mode asks of every IndexedSlices gradient (auto: its own decision per gradient).
_ASKED = {"sparse": "sparse", "dense": "dense", "dedup": "dedup"}


def recorded_reductions(collectives: Iterable[CollectiveSummary]) -> dict[str, set[str]]:
    """Per IndexedSlices gradient, the reductions its collective records show: dense (a densified
    allreduce), dedup (a merged allgather) or sparse (an allgather of its rows)."""
    found: dict[str, set[str]] = {}
    for c in collectives:
        if not c.get("sparse"):
            continue
        if c.get("densified"):
            kind = "dense"
        elif c.get("op") == "allgather":
            kind = "dedup" if c.get("merged") else "sparse"
        else:
            continue
        found.setdefault(c["name"], set()).add(kind)
    return found


def mode_applied(mode: str, collectives: Sequence[CollectiveSummary], policies: Sequence[PolicySummary],
                 not_applied: Mapping[str, str], labelling_error: str | None) -> ModeApplied | None:
    """``mode`` against the records (None as written, where nothing is asked). ``not_applied``: gradient
    name -> why the agent could not apply the mode to it; ``labelling_error``: the first failure to label
    gradients, if any (their allgathers then carry call-site names)."""
    if mode == AS_WRITTEN or mode not in (*_ASKED, "auto"):
        return None
    recorded = recorded_reductions(collectives)
    decided = {p["name"]: p.get("decision") for p in policies}
    names = sorted(set(recorded) | set(not_applied))
    applied: list[str] = []
    missed: list[NotApplied] = []
    for name in names:
        expected = _ASKED.get(mode) or decided.get(name)
        shown = sorted(recorded.get(name, set()))
        if expected is not None and shown == [expected]:
            applied.append(name)
            continue
        why = not_applied.get(name)
        if why is None:
            why = "no decision was recorded for it" if expected is None else \
                (f"memdiag could not label the gradients ({labelling_error})" if labelling_error
                 else "its records show another reduction")
        missed.append({"name": name, "expected": expected or "a decision", "recorded": shown, "why": why})
    unlabelled = sorted({c["name"] for c in collectives if c.get("op") == "allgather" and not c.get("sparse")
                         and "@" in c["name"]}) if labelling_error else []
    return {"mode": mode, "gradients": names, "applied": applied, "not_applied": missed, "unlabelled": unlabelled}


def not_applied_reasons(records: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Gradient name -> the first error a rank's ``not_applied`` record gives."""
    reasons: dict[str, str] = {}
    for r in records:
        if r.get("type") == "not_applied" and isinstance(r.get("name"), str):
            reasons.setdefault(r["name"], str(r.get("error")))
    return reasons
