"""Reports drawn into a fixed-width console: what they show, and that at 80 columns every table fits
without cutting a figure, a rank count or a mode, long tensor names being shortened from the left."""

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from memdiag._errors import UserError
from memdiag.analyze import compare as compare_analysis
from memdiag.analyze.attribution import Attribution, attribute_records
from memdiag.analyze.model import build_model, prediction_table
from memdiag.analyze.projection import Network
from memdiag.analyze.scaling import ProjectionRequest, analyze_dir
from memdiag.analyze.summary import summarize
from memdiag.doctor import Check
from memdiag.format.reader import load_run
from memdiag.report.attribution import attribution_section
from memdiag.report.compare import print_compare
from memdiag.report.doctor import print_checks
from memdiag.report.predict import print_prediction
from memdiag.report.scale import print_scale
from memdiag.report.terminal import print_run
from memdiag.units import format_bytes
from tests.unit.fake_run import make_run
from tests.unit.test_attribution import sample_records
from tests.unit.transformer_run import ROWS, load_summary, make_transformer_run


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
    # GIVEN a run of 3 ranks and 4 steps in which rank 1 stopped after step 0 without an end record and
    # rank 2 wrote no record at all, its run.json completed as the launcher completes it: a rank that is
    # not ok makes the run "failed" (memdiag.launch.session.conclude)
    path = make_run(tmp_path / "r", world_size=3, steps=4, kill_rank_after=0)
    (path / "rank-2.jsonl").unlink()
    manifest = json.loads((path / "run.json").read_text())
    manifest.update(status="failed", rank_status={"0": "ok", "1": "died", "2": "missing"})
    (path / "run.json").write_text(json.dumps(manifest))
    # WHEN its report is drawn
    run = load_run(str(path))
    text = render(summarize(run), run.manifest)
    flat = " ".join(text.split())
    # THEN the header says the run failed, and the rank table has rank 0 ok and rank 1 died
    assert "ranks 3" in flat and "status failed" in flat
    ranks = rows_by_key(text, keys=1)
    assert_row(ranks, ("0",), "ok")
    assert_row(ranks, ("1",), "died")
    # AND the headline names rank 1, alone, as the rank whose record of why it ended is missing
    assert "rank(s) 1 ended without a record of why (killed by a signal?); see mpirun.log" in flat
    # AND the warning names rank 2, alone, as the rank of which no record is there
    warnings = [line.strip() for line in text.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: no records from rank(s) 2"]
    # AND the parameter check covers only step 0, the one step rank 1 recorded
    assert "parameters identical on all ranks at each of 1 steps" in flat


def test_report_fits_an_80_column_terminal(tmp_path):
    run = load_run(str(make_run(tmp_path / "r")))
    text = render(summarize(run), run.manifest, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80


# -- every report fits an 80-column terminal: figures whole, names shortened from the left ---------




WIDTH = 80
MODES = ("sparse", "dense", "auto")
RANKS = (1, 2, 1200)
SOURCE_VALUES = "encoder/source_embedding/embeddings [values]"  # the common "transformer/" scope dropped
GIB = 2**30


def narrow(print_report, *args) -> str:
    out = io.StringIO()
    print_report(*args, Console(width=WIDTH, file=out, force_terminal=True, color_system=None))
    return out.getvalue()


def assert_fits(text: str) -> None:
    too_long = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_long, "\n".join(too_long)


def rows_by_key(text: str, keys: int = 2) -> dict[tuple[str, ...], list[str]]:
    """The cells of every table row, gathered by its first ``keys`` cells (a split table repeats them)."""
    rows: dict[tuple[str, ...], list[str]] = {}
    for line in text.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            rows.setdefault(tuple(cells[:keys]), []).extend(cells[keys:])
    return rows


def assert_row(rows: dict, key: tuple[str, ...], *figures: str) -> None:
    assert key in rows, f"no row {key} in {list(rows)}"
    for figure in figures:
        assert figure in rows[key], f"{figure!r} not a whole cell of row {key}: {rows[key]}"


def column_text(text: str, index: int) -> str:
    """One column's cells, line after line, joined at single spaces: what a wrapped column says."""
    cells = [line.strip().strip("│").split("│")[index] for line in text.splitlines()
             if line.startswith("│") and line.count("│") > index + 1]
    return " ".join(" ".join(cells).split())


def assert_shortened_from_the_left(text: str, full: str) -> None:
    tails = [line.split("…", 1)[1].split("│", 1)[0].rstrip() for line in text.splitlines() if "…" in line]
    assert any(full.endswith(tail) and len(tail) >= 15 for tail in tails), tails
    assert full not in text


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """Run directories of every mode at N = 1, 2, 1200, as a comparison writes them."""
    root = tmp_path_factory.mktemp("comparison")
    return {(n, mode): str(make_transformer_run(root / f"{mode}-n{n}", n, mode)) for n in RANKS for mode in MODES}


def test_run_report_at_80_columns_keeps_every_figure_and_shortens_names_from_the_left(tmp_path):
    path = make_transformer_run(tmp_path / "r", 4, "sparse")
    run = load_run(str(path))
    summary = load_summary(path)
    text = narrow(print_run, summary, run.manifest)
    assert_fits(text)
    assert "ranks 4" in text and "mode sparse" in text
    ranks = rows_by_key(text, keys=1)
    for r in summary["ranks"]:
        assert_row(ranks, (str(r["rank"]),), r["status"], format_bytes(r["peak_rss_bytes"]),
                   format_bytes(r["allgather_bytes_per_step"]), format_bytes(r["allreduce_bytes_per_step"]))
    for c in summary["collectives"]:
        assert f"{c['rows_in']}>{c['rows_out']}" in text and format_bytes(c["bytes_out_per_rank"]) in text
    assert f"{ROWS}>{4 * ROWS}" in text
    assert_shortened_from_the_left(text, SOURCE_VALUES)


def test_run_report_of_auto_wraps_the_policy_reasons_within_80_columns(comparison):
    path = comparison[(1200, "auto")]
    summary = load_summary(Path(path))
    summary["ranks"] = summary["ranks"][:4]  # the rank table is one row per rank: four are enough here
    text = narrow(print_run, summary, load_run(path).manifest)
    assert_fits(text)
    assert "ranks 1200" in text and "densified" in text and "dense allreduce" in text
    reasons = column_text(text, 2)
    for p in summary["policy"]:
        assert p["reason"] in reasons


def test_compare_report_at_80_columns_keeps_every_figure(comparison):
    result = compare_analysis.build("transformer", "base", comparison)
    result.update(modes=list(MODES), rank_counts=list(RANKS), steps=2)
    text = narrow(print_compare, result)
    assert_fits(text)
    rows = rows_by_key(text)
    for row in result["rows"]:
        assert_row(rows, (str(row["world_size"]), row["mode"]), format_bytes(row["steady_peak_rss_bytes_median"]),
                   format_bytes(row["collective_bytes_per_rank"]), format_bytes(row["allgather_bytes_per_rank"]),
                   row["status"])
    assert_row(rows, ("1200", "sparse"), "45.8 GiB")  # 2 tables x 1200 x 5000 x (4096 + 4) bytes
    growth = rows_by_key(text, keys=1)
    for mode, slope in result["collective_growth_bytes_per_rank"].items():
        assert_row(growth, (mode,), ("+" if slope >= 0 else "") + format_bytes(slope))


def test_a_comparison_written_in_the_first_format_reads_and_renders_as_the_current_one(comparison, tmp_path, capsys):
    # GIVEN a comparison's result, and the same result as compare.json's first format wrote it: no format
    # field, each row's steady peak (median over repeats) under the name summary.json gives the overall peak
    from memdiag.commands.report import load
    from memdiag.format import rundir
    from memdiag.report import reporter

    result = compare_analysis.build("transformer", "base", comparison)
    result.update(modes=list(MODES), rank_counts=list(RANKS), steps=2, format=rundir.COMPARE_FORMAT)
    old = json.loads(json.dumps(result))
    del old["format"]
    for row in old["rows"]:
        row["peak_rss_bytes_max"] = row.pop("steady_peak_rss_bytes_median")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / rundir.COMPARE_FILE).write_text(json.dumps(old))
    # WHEN memdiag reads it (as `memdiag report` and `memdiag compare --from` do)
    read = rundir.read_comparison(str(tmp_path / "old"))
    # THEN it is the current result, and its JSON and its report are the current ones
    assert read == json.loads(json.dumps(result))
    reporter.write(load(str(tmp_path / "old")), "json")
    assert json.loads(capsys.readouterr().out) == read
    rows = rows_by_key(narrow(print_compare, read))
    for row in result["rows"]:
        assert_row(rows, (str(row["world_size"]), row["mode"]), format_bytes(row["steady_peak_rss_bytes_median"]))
    # AND a merged tensor's rows, which format 1 named as a policy record named a rank's rows, are renamed
    merged = rundir.upgrade_comparison({"tensors": [{"name": "t", "dedup": {"rows_per_rank": 5000}}]})
    assert merged["tensors"][0]["dedup"] == {"rows_largest_rank": 5000} and merged["format"] == 2
    # AND a format this memdiag does not know is a one-line error that says what to do
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / rundir.COMPARE_FILE).write_text(json.dumps({**result, "format": 99}))
    with pytest.raises(UserError, match="format 99.*read it with the memdiag that wrote it"):
        rundir.read_comparison(str(tmp_path / "new"))


def prediction_summaries(comparison, split_peaks: bool) -> list[dict]:
    """The comparison's summaries at N <= 2; with ``split_peaks``, the fields a newer summary carries."""
    summaries = []
    for (n, mode), path in sorted(comparison.items()):
        if n > 2:
            continue
        summary = load_summary(Path(path))
        if split_peaks:
            gathered = n * 2 * ROWS * (2 * 4096 + 4) if mode == "sparse" and n > 1 else 0
            summary.update(compute_peak_rss_bytes_max=1.9 * GIB, collective_peak_rss_bytes_max=1.2 * GIB + gathered,
                           steady_peak_rss_bytes_max=max(1.9 * GIB, 1.2 * GIB + gathered))
        summaries.append(summary)
    return summaries


@pytest.mark.parametrize("split_peaks", [False, True])
def test_predict_report_at_80_columns_keeps_every_rank_count_mode_and_figure(comparison, split_peaks):
    summaries = prediction_summaries(comparison, split_peaks)
    table = prediction_table(build_model(summaries), [16, 64, 300, 1200], list(MODES), budget=4 * GIB)
    table["measured"] = [{"world_size": 1200, "mode": "dense", "peak_rss_bytes": 1.95 * GIB,
                          "collective_bytes_per_rank": 0}]
    text = narrow(print_prediction, table)
    assert_fits(text)
    rows = rows_by_key(text)
    for row in table["rows"]:
        peak = format_bytes(row["peak_rss_bytes"]) + (" OOM" if row["over_budget"] else "")
        assert_row(rows, (str(row["world_size"]), row["mode"]), format_bytes(row["collective_bytes_per_rank"]),
                   format_bytes(row["gathered_bytes_per_rank"]), peak, row["regime"] or "-")
    assert_row(rows, ("1200", "sparse"), "45.8 GiB")
    assert_row(rows, ("1200", "dense"), "1.95 GiB")  # the measured run beside the prediction
    flat = " ".join(text.split())
    assert f"k = {table['cost_per_gathered_byte']:.2f} bytes per gathered byte: with op=Average" in flat
    if split_peaks:
        n = table["regime_change_ranks"]["sparse"]
        assert f"sparse: compute sets the peak (1.9 GiB) up to N={n - 1}; from N={n} the gathered buffers do" in flat
        assert "dense: compute sets the peak (1.9 GiB) at every N up to 2^20" in flat
        assert [r["regime"] for r in table["rows"] if r["mode"] == "sparse"][-1] == "collectives"


def test_scale_report_at_80_columns_keeps_every_figure(comparison):
    request = ProjectionRequest([64, 300, 1200], Network(5e-6, 10e9, "default"))
    result = analyze_dir(comparison[(2, "sparse")], request)
    text = narrow(print_scale, result)
    assert_fits(text)
    rows = rows_by_key(text, keys=1)
    for row in result["rows"]:
        assert_row(rows, (str(row["world_size"]),), row["status"], format_bytes(row["peak_rss_bytes_max"]),
                   format_bytes(row["collective_bytes_per_rank"]), format_bytes(row["allgather_bytes_per_rank"]))
    for row in result["projection"]["rows"]:
        gathered = format_bytes(row["gathered_bytes_per_rank"]) + (" >MPI int" if row["exceeds_mpi_count"] else "")
        assert_row(rows, (str(row["world_size"]),), gathered,
                   *(f"{row[k] * 100:.0f}%" for k in ("weak_sparse_efficiency", "weak_dense_efficiency",
                                                     "strong_sparse_efficiency", "strong_dense_efficiency")))
    assert_row(rows, ("1200",), "45.8 GiB >MPI int")


def test_attribution_of_eight_ranks_at_80_columns_keeps_every_rank_and_figure():
    ranks = [attribute_records(sample_records(), rank=r, file=f"rank-{r}.memray.bin") for r in range(8)]
    entry = {"dir": "/runs/x", **Attribution(ranks, []).as_dict()}
    console = Console(width=WIDTH, file=io.StringIO(), force_terminal=True, color_system=None)
    console.print(attribution_section(entry))
    text = console.file.getvalue()
    assert_fits(text)
    for r in entry["ranks"]:
        assert f"rank {r['rank']}" in text and format_bytes(r["peak_bytes"]) in text
        for g in r["groups"]:
            assert f"{format_bytes(g['bytes'])} {g['share'] * 100:.0f}%" in text


def test_doctor_at_80_columns_keeps_check_names_and_statuses_whole():
    checks = [
        Check("tensorflow", "ok", "2.15.1"),
        Check("horovod", "fail", "horovod.tensorflow not importable (No module named 'horovod.tensorflow.mpi_lib')",
              "run `make setup` (builds Horovod 0.28.1 against TensorFlow 2.15.1 with "
              "HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1)"),
        Check("memory", "warn", "24.0 GiB total; 8 ranks of the small preset need about 1.90 GiB each",
              "use --mem-limit or fewer ranks"),
        Check("cores", "warn", "8 ranks on 2 cores", "step times are not a scaling measurement; use --hosts"),
    ]
    text = narrow(print_checks, checks)
    assert_fits(text)
    rows = rows_by_key(text, keys=1)
    for c in checks:
        assert_row(rows, (c.name,), c.status)
    findings = column_text(text, 2)
    for c in checks:
        assert c.finding in findings and f"fix: {c.fix}" * bool(c.fix) in findings  # wrapped at spaces


def test_memory_settings_of_the_users_environment_are_recorded_and_named_in_both_reports(tmp_path):
    from memdiag.launch.session import memory_environment

    environ = {"TF_ENABLE_ONEDNN_OPTS": "0", "MALLOC_ARENA_MAX": "2", "HOME": "/root", "OMP_NUM_THREADS": "1"}
    settings = memory_environment(environ)
    assert settings == {"TF_ENABLE_ONEDNN_OPTS": "0", "MALLOC_ARENA_MAX": "2"}  # allocator settings only
    assert memory_environment({"HOME": "/root"}) == {}

    run = load_run(str(make_run(tmp_path / "r", world_size=2, rows=256, width=32)))
    summary = summarize(run)
    assert "set in the environment" not in render(summary, run.manifest)  # nothing set: nothing said
    run.manifest["memory_environment"] = settings
    text = render(summarize(run), run.manifest)
    assert "set in the environment: TF_ENABLE_ONEDNN_OPTS=0 (oneDNN" in text
    assert "MALLOC_ARENA_MAX=2 (glibc's malloc arenas)" in text

    path = make_transformer_run(tmp_path / "c", 2, "sparse")
    assert compare_analysis.build("transformer", "small", {(2, "sparse"): str(path)})["memory_environment"] == {}
    with_settings = {**json.loads((path / "summary.json").read_text()), "memory_environment": settings}
    (path / "summary.json").write_text(json.dumps(with_settings))
    result = compare_analysis.build("transformer", "small", {(2, "sparse"): str(path)})
    assert result["memory_environment"] == settings
    result.update(modes=["sparse"], rank_counts=[2], steps=2)
    out = io.StringIO()
    print_compare(result, Console(width=80, file=out, force_terminal=True, color_system=None))
    assert "Set in the environment of every run: TF_ENABLE_ONEDNN_OPTS=0" in " ".join(out.getvalue().split())


def test_tf_distribute_run_report_names_the_engine_and_the_padding_per_tensor_within_80_columns(tmp_path):
    from types import SimpleNamespace

    from memdiag.analyze.padding import padding_summary

    # Worker r gathers the table padded to 2500 rows at N=4 (rows 1000 + 500 r): values 4 x 2500 x 1024 B,
    # indices 4 x 2500 x 4 B; padding (4 x 2500 - 7000) rows x 1024 and x 4. A second tensor has equal rows.
    name = "model_with_a_long_scope/embedding_of_the_words_of_the_source_language/embeddings:0"

    def gather(rank, step, part, row_bytes, tensor=name, padding_rows=3000):
        return {"type": "collective", "step": step, "op": "allgather", "name": tensor, "part": part,
                "bytes_out": 4 * 2500 * row_bytes, "pad_out_bytes": padding_rows * row_bytes}

    ranks = {r: SimpleNamespace(
        collectives=[gather(r, s, p, b) for s in (-1, 0, 1) for p, b in (("values", 1024), ("indices", 4))]
        + [gather(r, 0, "values", 1024, "even:0", 0)],
        policies=[{"name": name, "rows_per_worker": [1000, 1500, 2000, 2500]}]) for r in range(4)}
    run = SimpleNamespace(manifest={"engine": "tf-distribute"}, ranks=ranks)
    [entry] = padding_summary(run)
    assert entry["padding_bytes_per_step"] == 3000 * 1028 == 3_084_000
    assert entry["gathered_bytes_per_step"] == 4 * 2500 * 1028 == 10_280_000
    assert abs(entry["padding_share"] - 0.3) < 1e-12  # 3000 of the 10,000 rows gathered
    assert padding_summary(SimpleNamespace(manifest={}, ranks=ranks)) == []  # Horovod: no padding

    path = make_transformer_run(tmp_path / "r", 4, "sparse")
    summary = {**load_summary(path), "padding": [entry], "engine": "tf-distribute"}
    manifest = {**load_run(str(path)).manifest, "engine": "tf-distribute"}
    text = narrow(print_run, summary, manifest)
    assert_fits(text)
    assert "engine tf-distribute" in text and "Padded gathers" in text
    rows = rows_by_key(text, keys=1)
    shown = name[:-len(":0")]  # the output index is left out, the name shortened from the left
    [key] = [k for k in rows if k[0].startswith("…") and shown.endswith(k[0][1:]) and len(k[0]) > 15]
    assert_row(rows, key, "1000-2500", format_bytes(10_280_000), format_bytes(3_084_000), "30%")


def test_a_tf_distribute_override_is_not_described_as_horovods_sparse_as_dense(tmp_path):
    path = make_transformer_run(tmp_path / "r", 4, "sparse")
    policy = {"name": "embeddings:0", "decision": "dense", "overridden": True, "script_sparse_as_dense": False,
              "mode": "auto", "reason": "auto"}
    manifest = load_run(str(path)).manifest
    base = {**load_summary(path), "policy": [policy]}
    horovod = " ".join(render(base, manifest).split())
    assert "the script asked for sparse_as_dense=False for embeddings:0; this run used dense" in horovod
    mwms = " ".join(render({**base, "engine": "tf-distribute"}, {**manifest, "engine": "tf-distribute"}).split())
    assert "sparse_as_dense" not in mwms
    assert "as written, MultiWorkerMirroredStrategy gathers embeddings:0 (padded rows); this run used dense" in mwms
