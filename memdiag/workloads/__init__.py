"""Built-in training workloads, by name."""

from __future__ import annotations

from typing import Any

from memdiag._errors import UserError

WORKLOADS = ("transformer", "mixed", "resnet50")


def presets(name: str) -> dict[str, Any]:
    """The presets of a built-in workload (imports TensorFlow-free config modules only)."""
    from memdiag.workloads import configs

    return configs.PRESETS[name]


def check(name: str, preset: str) -> None:
    if name not in WORKLOADS:
        raise UserError(
            f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)} or give a path to a .py script"
        )
    known = presets(name)
    if preset not in known:
        raise UserError(f"workload {name} has no preset {preset!r}; choose one of {', '.join(known)}")
