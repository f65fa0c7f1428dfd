"""Event files read back with TensorBoard's own reader (its event accumulator), for the tests of
`memdiag report --format tensorboard`. Import it at a test module's top: TensorBoard's reader loads
TensorFlow (or its stub) on first use, and TensorFlow sets variables in the environment when imported,
which tests/conftest.py fails a test for; loaded with the module, that happens before any test."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

with contextlib.suppress(ImportError):  # what TensorBoard's reader loads on first use, where it is installed
    import tensorflow  # noqa: F401


def read_back(run_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> {step: value} of one TensorBoard run directory; a step written twice fails."""
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    series: dict[str, dict[int, float]] = {}
    for tag in events.Tags()["tensors"]:
        points = events.Tensors(tag)
        steps = [e.step for e in points]
        assert len(steps) == len(set(steps)), f"{tag}: a step written twice"
        series[tag] = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in points}
    return series
