"""What the launcher tells every rank's agent: one dataclass, written by the launcher, read by the agent.

It travels on the command line of ``python -m memdiag.agent`` as base64 JSON. No field has a
default here: the launcher fills every one from the request and its
:class:`memdiag.launch.options.LaunchOptions`, where the defaults are stated, so the two sides
cannot disagree about a value that was left out.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, fields
from typing import Any

HOROVOD = "horovod"
TF_DISTRIBUTE = "tf-distribute"  # tf.distribute.MultiWorkerMirroredStrategy, one worker per rank
ENGINES = (HOROVOD, TF_DISTRIBUTE)
# What --engine tf-distribute runs for now, on one host: scripts and these built-in workloads (their
# MultiWorkerMirroredStrategy variant; resnet50 is Horovod's only), in these modes (not dedup; a built-in
# workload's as-written is sparse, what its code does).
TF_DISTRIBUTE_MODES = ("as-written", "sparse", "dense", "auto")
TF_DISTRIBUTE_WORKLOADS = ("transformer", "mixed")


@dataclass(frozen=True)
class AgentConfig:
    run_id: str
    run_dir: str  # absolute
    workload: str | None  # a built-in workload, or None for a script
    script: str | None  # absolute path of the user's script
    script_args: tuple[str, ...]
    preset: str
    overrides: dict[str, str]
    mode: str
    steps: int
    margin: float
    seed: int
    spool: str
    check_params: bool
    sample_interval_s: float
    fault: str | None  # injected on purpose by tests of the verification
    check_reduction: bool
    memray: bool
    mem_limit_bytes: int | None
    threads_per_rank: int | None
    max_warmup: int  # built-in workloads: extra steps allowed until the per-step peak settles
    engine: str  # one of ENGINES: what reduces the gradients (Horovod, or TensorFlow's own strategy)
    # wall-clock time (epoch s) past which no agreement between ranks waits (memdiag.agreement.run_deadline);
    # None: the run has no time limit
    agree_until: float | None
    # --record-every: how often the sampling thread turns native marks into records (0: at every wake,
    # which is every step; memdiag.agent.hooks.CollectiveHooks.drain_when_due)
    record_every_s: float = 0.0
    # a comparison's runs: a fingerprint of each IndexedSlices gradient the first time it is reduced, before
    # any mode changes it (``first_gradient`` records), which tells a script's own randomness from a mode's
    fingerprint_gradients: bool = False

    @property
    def is_script(self) -> bool:
        return self.script is not None

    def encode(self) -> str:
        return base64.urlsafe_b64encode(json.dumps(asdict(self)).encode()).decode()

    @classmethod
    def decode(cls, text: str) -> AgentConfig:
        data: dict[str, Any] = json.loads(base64.urlsafe_b64decode(text.encode()))
        names = {f.name for f in fields(cls)}
        missing = names - set(data)
        if missing:
            raise ValueError(f"agent configuration lacks {', '.join(sorted(missing))}: launcher and agent "
                             "come from different memdiag versions")
        data["script_args"] = tuple(data["script_args"])
        return cls(**{k: v for k, v in data.items() if k in names})
