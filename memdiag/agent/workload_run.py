"""What a rank runs: the user's script, as ``python SCRIPT ARGS`` would run it, or a built-in workload."""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

from memdiag.agent.tracer import Tracer
from memdiag.agentconfig import HOROVOD, AgentConfig
from memdiag.agreement import Agreement


def run_script(config: AgentConfig) -> None:
    """The user's script as ``python SCRIPT ARGS`` would run it; ``sys.exit(0)`` is a success like
    reaching the end (any other exit status is raised on as the script's failure)."""
    assert config.script is not None
    sys.argv = [config.script, *config.script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(config.script)))
    try:
        runpy.run_path(config.script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise


def run_builtin(config: AgentConfig, tracer: Tracer, spool: str, hooks: Any, rank: int, size: int,
                agreement: Agreement | None = None) -> None:
    """A built-in workload on this rank; ``agreement`` as :attr:`WorkloadContext.agreement` (None:
    Horovod's)."""
    from memdiag.workloads.loop import WorkloadContext

    # Under the strategy, auto decides when the step is traced, from every worker's rows agreed over
    # MPI (StrategyHooks.decide); the decision from the first batch's ids agrees through Horovod.
    decide_lookups = hooks.decide_lookups if config.mode == "auto" and size > 1 and config.engine == HOROVOD \
        else None
    ctx = WorkloadContext(
        tracer=tracer,
        rank=rank,
        size=size,
        steps=config.steps,
        seed=config.seed,
        preset=config.preset,
        overrides=config.overrides,
        run_dir=spool,
        check_params=config.check_params,
        max_warmup=config.max_warmup,
        decide_lookups=decide_lookups,
        engine=config.engine,
        agreement=agreement,
    )
    if config.workload == "resnet50":
        from memdiag.workloads import resnet

        resnet.run(ctx)
    else:
        from memdiag.workloads import transformer

        transformer.run(ctx, workload=config.workload or "transformer")
