"""The JSON output: each subject as one JSON document on stdout (a run's summary recomputed from its
records, a study's compare.json or scale.json, a prediction's table, the doctor's checks)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from memdiag.report.reporter import DoctorResult, PredictionResult, Refusing, RunResult, StudyResult


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


class JsonReporter(Refusing):
    name = "json"

    def run(self, result: RunResult, output: str | None) -> None:
        _print(result.summary)

    def study(self, result: StudyResult, output: str | None) -> None:
        _print(result.document)

    def prediction(self, result: PredictionResult, output: str | None) -> None:
        _print(result.table)

    def doctor(self, result: DoctorResult, output: str | None) -> None:
        _print({"checks": [dataclasses.asdict(c) for c in result.checks],
                "failed": [c.name for c in result.checks if c.status == "fail"]})
