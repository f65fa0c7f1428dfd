"""The reporter interface: a reporter writes one output (the terminal report, JSON, Markdown, a
Chrome trace, TensorBoard event files) of one result, a run or a study (a comparison or a scaling
study). ``memdiag report DIR --format F`` builds the result from the directory and hands it to the
reporter named F in :data:`REPORTERS`; a new output is one module with one class added there."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from memdiag import rundir
from memdiag._errors import UserError

if TYPE_CHECKING:
    from memdiag.collect import Run
    from memdiag.schema import RunSummary


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


class Reporter(Protocol):
    """One output. ``run`` and ``study`` write it for their subject, to stdout or under ``output``;
    a reporter that cannot show a subject raises a UserError that says what it can show."""

    @property
    def name(self) -> str: ...  # the --format value

    @property
    def output_help(self) -> str | None: ...  # what --output means for it; None: it takes no --output

    def run(self, result: RunResult, output: str | None) -> None: ...

    def study(self, result: StudyResult, output: str | None) -> None: ...


class TextReporter:
    name, help, output_help = "text", "the terminal report (default)", None

    def run(self, result: RunResult, output: str | None) -> None:
        from rich.console import Console

        from memdiag.report.terminal import print_run

        print_run(result.summary, result.run.manifest, Console())

    def study(self, result: StudyResult, output: str | None) -> None:
        from rich.console import Console

        if result.kind == rundir.SCALE:
            from memdiag.report.scale import print_scale

            print_scale(result.document, Console())  # type: ignore[arg-type]  # scale.json as `memdiag scale` wrote it
            return
        from memdiag.report.compare import print_compare

        print_compare(_comparison(result, self.name), Console())


class JsonReporter:
    name, help, output_help = "json", "a run's summary (recomputed), or a study's compare.json or scale.json, on stdout", None

    def run(self, result: RunResult, output: str | None) -> None:
        import json

        print(json.dumps(result.summary, indent=2, default=str))

    def study(self, result: StudyResult, output: str | None) -> None:
        import json

        print(json.dumps(result.document, indent=2))


class MarkdownReporter:
    name, help, output_help = "markdown", "Markdown tables for issues and docs, on stdout", None

    def run(self, result: RunResult, output: str | None) -> None:
        from memdiag.report.markdown import run_markdown

        print(run_markdown(result.summary, result.run.manifest))

    def study(self, result: StudyResult, output: str | None) -> None:
        from memdiag.report.markdown import compare_markdown

        print(compare_markdown(_comparison(result, self.name)))


class ChromeReporter:
    name, help = "chrome", "a trace for Perfetto / chrome://tracing"
    output_help = "the trace file (default DIR/trace.json)"

    def run(self, result: RunResult, output: str | None) -> None:
        from memdiag.report.trace import write_chrome_trace

        trace = write_chrome_trace(result.run, output)
        print(f"wrote {trace.path}: {trace.events} events, {trace.ranks} ranks"
              + (f", {trace.horovod_events} from Horovod's timeline" if trace.horovod_events else "")
              + " (open it in ui.perfetto.dev or chrome://tracing)")
        for note in trace.notes:
            print(f"note: {note}")

    def study(self, result: StudyResult, output: str | None) -> None:
        raise UserError(f"--format chrome traces one run: give a run directory inside {result.path}")


def _comparison(result: StudyResult, fmt: str) -> Any:
    if result.kind != rundir.COMPARISON:
        raise UserError(f"--format {fmt} does not show a scaling study ({result.path}): use --format text, json or "
                        "tensorboard, or give one run directory inside it")
    return result.document


def _tensorboard() -> Reporter:
    from memdiag.report.tensorboard import TensorBoardReporter

    return TensorBoardReporter()


REPORTERS: dict[str, Any] = {
    "text": TextReporter, "json": JsonReporter, "markdown": MarkdownReporter, "chrome": ChromeReporter,
    "tensorboard": _tensorboard,
}
"""--format value -> a callable that makes its reporter (TensorBoard's module is imported when chosen)."""

FILE_FORMATS = ("chrome", "tensorboard")  # the formats that write files, and so take --output


def reporter(name: str) -> Reporter:
    made: Reporter = REPORTERS[name]()
    return made


def write(result: RunResult | StudyResult, fmt: str, output: str | None = None) -> None:
    """Hand ``result`` to the reporter named ``fmt``."""
    chosen = reporter(fmt)
    if output is not None and chosen.output_help is None:
        raise UserError(f"--output is where {' or '.join('--format ' + f for f in FILE_FORMATS)} write; "
                        f"--format {fmt} prints to stdout: drop --output")
    if isinstance(result, RunResult):
        chosen.run(result, output)
    else:
        chosen.study(result, output)
