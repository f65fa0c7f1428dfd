"""`memdiag predict` on a comparison made with --engine both: one engine's runs are fitted, never a mix.

The runs are written by memdiag's own record writer (tests/unit/fake_run.py): a Horovod run at N=2
and a MultiWorkerMirroredStrategy run at N=4, told apart by their run.json as the launcher writes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memdiag.cli import main
from tests.unit.fake_run import make_run


@pytest.fixture()
def both(tmp_path) -> Path:
    root = tmp_path / "compare-both"
    make_run(root / "n2-sparse", world_size=2)
    tfd = make_run(root / "tfd-n4-sparse", world_size=4)
    manifest = json.loads((tfd / "run.json").read_text())
    (tfd / "run.json").write_text(json.dumps({**manifest, "engine": "tf-distribute"}))
    (root / "compare.json").write_text(json.dumps({"engine": "both"}))
    return root


def test_predict_refuses_a_mix_of_engines_in_one_line_and_names_both(both, capsys):
    assert main(["predict", str(both), "--ranks", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "horovod and tf-distribute" in err and "--engine horovod" in err and "--engine tf-distribute" in err


@pytest.mark.parametrize("engine, fitted", [("horovod", [2]), ("tf-distribute", [4])])
def test_predict_fits_the_runs_of_the_engine_asked_for(both, capsys, engine, fitted):
    assert main(["predict", str(both), "--ranks", "2,4", "--modes", "sparse", "--engine", engine,
                 "--format", "json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [m["world_size"] for m in table["measured"]] == fitted


def test_predict_refuses_an_engine_the_directory_has_no_runs_of(both, capsys):
    make_run(both.parent / "plain", world_size=2)
    assert main(["predict", str(both.parent / "plain"), "--engine", "tf-distribute"]) == 2
    assert "holds runs of horovod only" in capsys.readouterr().err
