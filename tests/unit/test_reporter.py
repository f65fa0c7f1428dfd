"""The reporter interface: every --format is one reporter class in its own module, shows the subjects
the registry says and refuses the others with the formats that show them; the doctor's and predict's
outputs go through it too."""

from __future__ import annotations

import json

import pytest

from memdiag._errors import UserError
from memdiag.doctor import Check
from memdiag.report import reporter
from memdiag.report.reporter import REPORTERS, DoctorResult, PredictionResult, Refusing, StudyResult


@pytest.mark.parametrize("fmt", sorted(REPORTERS))
def test_each_format_s_reporter_shows_what_the_registry_says_and_refuses_the_rest(fmt):
    made = reporter.reporter(fmt)
    assert made.name == fmt and type(made).__module__ == REPORTERS[fmt][0]
    nothing = {"run": None, "study": StudyResult("a-study", "comparison", {}), "prediction": None, "doctor": None}
    for subject, result in nothing.items():
        if subject in reporter.shows(fmt):
            assert getattr(type(made), subject) is not getattr(Refusing, subject), (fmt, subject)
        else:
            with pytest.raises(UserError):
                getattr(made, subject)(result, None)


def test_a_subject_a_format_does_not_show_is_a_one_line_error_naming_the_formats_that_do():
    with pytest.raises(UserError) as refused:
        reporter.write(PredictionResult({"rows": []}), "markdown")  # type: ignore[typeddict-item]
    assert str(refused.value) == "--format markdown does not show a prediction: use --format text or json"
    with pytest.raises(UserError, match="drop --output"):
        reporter.write(DoctorResult([]), "json", output="somewhere")


def test_the_doctor_s_json_holds_every_check_and_names_the_failed_ones(capsys):
    checks = [Check("python", "ok", "3.11.7"), Check("horovod", "fail", "0.28.1 built without MPI", "rebuild it"),
              Check("cores", "warn", "4 ranks on 2 cores", "fewer ranks")]
    reporter.write(DoctorResult(checks), "json")
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] == ["horovod"]
    assert out["checks"] == [{"name": c.name, "status": c.status, "finding": c.finding, "fix": c.fix} for c in checks]


def test_command_format_choices_come_from_the_registry():
    assert reporter.formats_for("prediction") == ("text", "json")
    assert reporter.formats_for("doctor") == ("text", "json")
    assert set(reporter.formats_for("run")) == {"text", "json", "markdown", "chrome", "tensorboard"}
