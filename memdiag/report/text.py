"""The text output: each subject's report for the terminal (rich), to stdout."""

from __future__ import annotations

from rich.console import Console

from memdiag.format import rundir
from memdiag.report.reporter import DoctorResult, PredictionResult, Refusing, RunResult, StudyResult


class TextReporter(Refusing):
    name = "text"

    def run(self, result: RunResult, output: str | None) -> None:
        from memdiag.report.terminal import print_run

        print_run(result.summary, result.run.manifest, Console())

    def study(self, result: StudyResult, output: str | None) -> None:
        if result.kind == rundir.SCALE:
            from memdiag.report.scale import print_scale

            print_scale(result.document, Console())  # type: ignore[arg-type]  # scale.json as `memdiag scale` wrote it
            return
        from memdiag.report.compare import print_compare

        print_compare(result.document, Console())  # type: ignore[arg-type]  # compare.json, upgraded when read

    def prediction(self, result: PredictionResult, output: str | None) -> None:
        from memdiag.report.predict import print_prediction

        print_prediction(result.table, Console())

    def doctor(self, result: DoctorResult, output: str | None) -> None:
        from memdiag.report.doctor import print_checks

        print_checks(result.checks, Console())
