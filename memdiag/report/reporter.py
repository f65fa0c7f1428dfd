"""The reporter interface: a reporter writes one output (the terminal report, JSON, Markdown, a
Chrome trace, TensorBoard event files) of one result: a run, a study of runs (a comparison or a
scaling study), a prediction, or the doctor's checks. Each output is one module with one reporter class
(text.py, json_output.py, markdown.py, trace.py, tensorboard.py), named in :data:`REPORTERS`; the
commands build the result and hand it to the reporter ``--format`` names (:func:`write`). A subject an
output does not show is refused with a one-line error that says which formats show it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Union

from memdiag._errors import UserError
from memdiag.format import rundir

if TYPE_CHECKING:
    from memdiag.doctor import Check
    from memdiag.format.reader import Run
    from memdiag.format.results import Prediction, RunSummary


@dataclass
class RunResult:
    """One run directory: its records, and the summary recomputed from them on first use."""

    path: str
    run: Run
    _summary: RunSummary | None = field(default=None, repr=False)

    @property
    def summary(self) -> RunSummary:
        if self._summary is None:
            from memdiag.analyze.summary import summarize

            self._summary = summarize(self.run)  # always from the records: the directory is the truth
        return self._summary


@dataclass
class StudyResult:
    """A directory of several runs: a comparison (``compare.json``) or a scaling study (``scale.json``)."""

    path: str
    kind: str  # rundir.COMPARISON or rundir.SCALE
    document: dict[str, Any]  # compare.json or scale.json as read (upgraded to the current format)

    @property
    def run_paths(self) -> list[str]:
        """Its measured runs, in name order (verification runs left out)."""
        return rundir.runs_of(self.path)


@dataclass
class PredictionResult:
    """``memdiag predict``'s table (memdiag.analyze.model.prediction_table, with the measured rows)."""

    table: Prediction


@dataclass
class DoctorResult:
    """``memdiag doctor``'s checks, in the order they ran."""

    checks: list[Check]


Result = Union[RunResult, StudyResult, PredictionResult, DoctorResult]
SUBJECTS: dict[type, str] = {RunResult: "run", StudyResult: "study", PredictionResult: "prediction",
                             DoctorResult: "doctor"}
"""Result type -> the name of the reporter method that writes it."""


class Reporter(Protocol):
    """One output: a method per subject, writing to stdout or under ``output``."""

    @property
    def name(self) -> str: ...  # the --format value

    @property
    def output_help(self) -> str | None: ...  # what --output means for it; None: it prints, and takes none

    def run(self, result: RunResult, output: str | None) -> None: ...

    def study(self, result: StudyResult, output: str | None) -> None: ...

    def prediction(self, result: PredictionResult, output: str | None) -> None: ...

    def doctor(self, result: DoctorResult, output: str | None) -> None: ...


class Refusing:
    """A reporter's subjects it does not show: each refuses with the formats that do show it."""

    name = "?"
    output_help: str | None = None

    def _refuse(self, subject: str) -> None:
        showing = [fmt for fmt in REPORTERS if subject in shows(fmt)]
        raise UserError(f"--format {self.name} does not show a {subject}: use --format {' or '.join(showing)}")

    def run(self, result: RunResult, output: str | None) -> None:
        self._refuse("run")

    def study(self, result: StudyResult, output: str | None) -> None:
        self._refuse("study")

    def prediction(self, result: PredictionResult, output: str | None) -> None:
        self._refuse("prediction")

    def doctor(self, result: DoctorResult, output: str | None) -> None:
        self._refuse("doctor")


REPORTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "text": ("memdiag.report.text", "TextReporter", ("run", "study", "prediction", "doctor")),
    "json": ("memdiag.report.json_output", "JsonReporter", ("run", "study", "prediction", "doctor")),
    "markdown": ("memdiag.report.markdown", "MarkdownReporter", ("run", "study")),
    "chrome": ("memdiag.report.trace", "ChromeReporter", ("run",)),
    "tensorboard": ("memdiag.report.tensorboard", "TensorBoardReporter", ("run", "study")),
}
"""--format value -> (module, class, the subjects it shows). A module is imported when its format is
chosen (TensorBoard's only then)."""


def shows(fmt: str) -> tuple[str, ...]:
    return REPORTERS[fmt][2]


def formats_for(subject: str) -> tuple[str, ...]:
    """The --format choices of a command whose result is ``subject``."""
    return tuple(fmt for fmt, (_, _, subjects) in REPORTERS.items() if subject in subjects)


def reporter(fmt: str) -> Reporter:
    module, cls, _ = REPORTERS[fmt]
    made: Reporter = getattr(importlib.import_module(module), cls)()
    return made


def write(result: Result, fmt: str, output: str | None = None) -> None:
    """Hand ``result`` to the reporter named ``fmt``."""
    chosen = reporter(fmt)
    if output is not None and chosen.output_help is None:
        writers = [f for f in REPORTERS if reporter(f).output_help is not None]
        raise UserError(f"--output is where {' or '.join('--format ' + f for f in writers)} write; "
                        f"--format {fmt} prints to stdout: drop --output")
    getattr(chosen, SUBJECTS[type(result)])(result, output)
