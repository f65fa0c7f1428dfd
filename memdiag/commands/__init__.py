"""The CLI's verbs. Each is a small class: ``prepare_parser`` declares, ``run`` delegates."""

from __future__ import annotations

import argparse
from typing import Protocol

from memdiag.commands.agent import AgentCommand
from memdiag.commands.collect import CollectCommand
from memdiag.commands.compare import CompareCommand
from memdiag.commands.doctor import DoctorCommand
from memdiag.commands.predict import PredictCommand
from memdiag.commands.report import ReportCommand
from memdiag.commands.run import RunCommand
from memdiag.commands.scale import ScaleCommand
from memdiag.commands.watch import WatchCommand


class Command(Protocol):
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, script_args: list[str]) -> int: ...


COMMANDS: dict[str, type[Command]] = {
    "run": RunCommand,
    "compare": CompareCommand,
    "report": ReportCommand,
    "scale": ScaleCommand,
    "predict": PredictCommand,
    "doctor": DoctorCommand,
    "agent": AgentCommand,
    "collect": CollectCommand,
    "watch": WatchCommand,
}
