import io

from rich.console import Console

from memdiag.analyze.summary import summarize
from memdiag.collect import load_run
from memdiag.report.terminal import print_run

from tests.unit.fake_run import make_run


def render(summary, manifest, width=120) -> str:
    out = io.StringIO()
    print_run(summary, manifest, Console(width=width, file=out, force_terminal=True, color_system=None))
    return out.getvalue()


def test_run_report_shows_ranks_tensors_and_consistency(tmp_path):
    run = load_run(str(make_run(tmp_path / "r", world_size=2, rows=256, width=32)))
    text = render(summarize(run), run.manifest)
    assert "transformer (tiny)" in text and "mode sparse" in text and "ranks 2" in text
    assert "emb [values]" in text and "256>512" in text and "64 KiB" in text  # 2 x 256 x 32 x 4
    assert "emb [indices]" in text
    assert "parameters identical on all ranks at each of 3 steps" in text
    rank_lines = [line for line in text.splitlines() if line.strip().startswith(("│    0", "│    1"))]
    assert len(rank_lines) == 2


def test_run_report_names_a_dead_rank_and_warns_about_missing_records(tmp_path):
    path = make_run(tmp_path / "r", world_size=2, steps=4, kill_rank_after=0)
    run = load_run(str(path))
    text = render(summarize(run), run.manifest)
    assert "died" in text


def test_report_fits_an_80_column_terminal(tmp_path):
    run = load_run(str(make_run(tmp_path / "r")))
    text = render(summarize(run), run.manifest, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
