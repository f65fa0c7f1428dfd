"""The CLI's verbs. Each is a small class: ``prepare_parser`` declares, ``run`` delegates."""

from __future__ import annotations

from memdiag.commands.compare import CompareCommand
from memdiag.commands.doctor import DoctorCommand
from memdiag.commands.predict import PredictCommand
from memdiag.commands.report import ReportCommand
from memdiag.commands.run import RunCommand
from memdiag.commands.scale import ScaleCommand

COMMANDS = {
    "run": RunCommand,
    "compare": CompareCommand,
    "report": ReportCommand,
    "scale": ScaleCommand,
    "predict": PredictCommand,
    "doctor": DoctorCommand,
}
