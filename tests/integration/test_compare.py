"""`memdiag compare sparse-vs-dense` on real ranks: table, growth, correctness, and a fault it must catch."""

from __future__ import annotations

import json

import pytest

from memdiag.workloads.configs import PRESETS
from tests.helpers import memdiag, read_json, read_records, undeclared_record_fields

# The shared comparison runs four modes at two rank counts, then the verification: more than the
# default 600 s on 2 shared cores under load.
pytestmark = [pytest.mark.mpi, pytest.mark.timeout(1500)]
TINY = PRESETS["transformer"]["tiny"]


@pytest.fixture(scope="module")
def comparison(runs_root):
    out = runs_root / "compare"
    result = memdiag("compare", "sparse-vs-dense", "transformer", "-n", "1,2", "--steps", "2",
                     "--modes", "sparse,dense,auto,dedup", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    return out, result


def test_compare_writes_rows_growth_and_correctness(comparison):
    out, result = comparison
    data = read_json(out / "compare.json")
    modes = ("sparse", "dense", "auto", "dedup")
    assert {(r["world_size"], r["mode"]) for r in data["rows"]} == {(n, m) for n in (1, 2) for m in modes}
    for row in data["rows"]:
        assert {"world_size", "mode", "steady_peak_rss_bytes_median", "collective_bytes_per_rank", "step_time_s"} <= set(row)
        assert row["steady_peak_rss_bytes_median"] > 0 and row["status"] == "ok"
    assert set(data["growth_bytes_per_rank"]) == set(modes)
    c = data["correctness"]
    assert c["passed"] is True and c["max_abs_diff"] is not None and c["max_rel_diff"] is not None
    # every mode's and the verification runs' records: every field declared in memdiag.format.records
    assert undeclared_record_fields(out) == {}
    assert c["reduction"]["passed"] is True and c["reduction"]["tensors"]
    # merged and unmerged reductions agree within the tolerance, as do the final parameters of dedup
    assert set(c["reduction"]["by_reduction"]) == {"dense", "dedup"}
    assert c["reduction"]["by_reduction"]["dedup"]["passed"] is True
    assert any(check["mode"] == "dedup" and check["passed"] for check in c["checks"])
    # the formula's growth per added rank is one rank's gathered rows: values and indices
    rows = TINY.batch_size * TINY.seq_len
    assert data["predicted_growth_bytes_per_rank"] in (rows * (TINY.d_model * 4 + 4), rows * (TINY.d_model * 4 + 8))
    [tensor] = [t for t in data["tensors"] if t.get("growth_bytes_per_rank")]
    assert "source_embedding" in tensor["name"] and tensor["auto_decision"] in ("sparse", "dedup", "dense")
    # merging gathered fewer bytes than the allgather of every row, and its cost was measured
    dedup = tensor["dedup"]
    assert dedup["distinct_rows_max"] < dedup["rows_largest_rank"] == rows
    assert 0 < dedup["gathered_bytes"] < dedup["unmerged_gathered_bytes"] and dedup["merge_s_median"] > 0
    for text in ("Per rank count and mode", "Growth per added rank", "peak RSS per rank", "Correctness PASSED"):
        assert text in result.stdout
    # a built-in workload's auto decided from the first batch's ids before tracing (no run-time switch)
    records = [r for r in read_records(out / "n2-auto" / "rank-0.jsonl") if r["type"] == "policy"]
    policies = [r for r in records if "optimizer_input" not in r]
    assert policies and all("before the step was traced" in p["reason"] for p in policies)
    assert all(p["step"] == -1 and p["distinct_rows"] is not None for p in policies)
    # a table kept gathered reaches Keras Adam summed dense (memdiag.optimizer_input), said by a second record
    # when the step's update was built; the summary's entry takes it
    kept = {p["name"] for p in policies if p["decision"] != "dense"}
    assert {r["name"] for r in records if r.get("optimizer") == "Adam" and r["optimizer_input"] == "dense"} == kept
    entries = read_json(out / "n2-auto" / "summary.json")["policy"]
    assert {e["name"] for e in entries if e.get("optimizer_input") == "dense"} == kept


UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def assert_shows(cell: str, n: float) -> None:
    """``cell`` shows ``n`` bytes: a number and a binary unit, to the 3 significant figures (or whole
    units from 100 up, whole bytes below 1 KiB) the reports give."""
    number, unit = cell.split()
    shown = float(number) * UNITS[unit]
    assert abs(shown - n) <= (1 if unit == "B" else 0.005 * abs(n)), f"{cell!r} shows {shown}, not {n}"


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every Markdown table of ``text``: its rows (the header first, the --- line left out) as cells."""
    tables: list[list[list[str]]] = []
    previous = ""
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append([c.strip() for c in line.strip().strip("|").split("|")])
        previous = line
    return tables


def test_compare_report_rerenders_from_the_directory(comparison):
    # GIVEN the comparison of modes sparse, dense, auto and dedup at 1 and 2 ranks, and the compare.json it wrote
    out, _ = comparison
    data = read_json(out / "compare.json")
    pairs = {(n, m) for n in (1, 2) for m in ("sparse", "dense", "auto", "dedup")}
    peaks = {(r["world_size"], r["mode"]): r["steady_peak_rss_bytes_median"] for r in data["rows"]}
    assert set(peaks) == pairs and all(peaks.values())
    # WHEN `memdiag report DIR` reads it in each format
    again = memdiag("report", str(out))
    as_json = memdiag("report", str(out), "--format", "json")
    md = memdiag("report", str(out), "--format", "markdown")
    assert again.returncode == 0 and as_json.returncode == 0 and md.returncode == 0, again.stderr + md.stderr
    # THEN the JSON is compare.json itself: the same rows, growth and correctness
    assert json.loads(as_json.stdout) == data
    # AND the text table has a row per (N, mode) showing compare.json's peak, and the verdict
    text_rows: dict[tuple[int, str], list[str]] = {}
    for line in again.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")] if line.startswith("│") else []
        if len(cells) > 2 and cells[0].isdigit():
            text_rows.setdefault((int(cells[0]), cells[1]), cells)
    assert set(text_rows) == pairs
    for key, cells in text_rows.items():
        assert_shows(cells[2], peaks[key])
    assert "Correctness PASSED" in again.stdout
    # AND the Markdown names the comparison, then has one row per (N, mode) with its peak, collective
    # bytes and status as compare.json says, one row per mode with its growth, and the verdict
    assert md.stdout.startswith("## compare sparse-vs-dense: transformer\n")
    table, growth = markdown_tables(md.stdout)
    assert table[0] == ["N", "mode", "peak RSS (max)", "collective bytes/rank/step", "step time", "status"]
    keys = [(int(row[0]), row[1]) for row in table[1:]]
    assert sorted(keys) == sorted(pairs)  # each once
    for row in table[1:]:
        [source] = [r for r in data["rows"] if (r["world_size"], r["mode"]) == (int(row[0]), row[1])]
        assert_shows(row[2], source["steady_peak_rss_bytes_median"])
        assert_shows(row[3], source["collective_bytes_per_rank"])
        assert row[5] == source["status"] == "ok"
    assert growth[0] == ["mode", "peak RSS growth per added rank"]
    assert sorted(row[0] for row in growth[1:]) == ["auto", "dedup", "dense", "sparse"]
    for mode, shown in growth[1:]:
        assert_shows(shown, data["growth_bytes_per_rank"][mode])
    assert "Correctness passed: True" in md.stdout


def test_predict_from_the_comparison_is_exact_for_collective_bytes(comparison):
    out, _ = comparison
    import json

    result = memdiag("predict", str(out), "--ranks", "2,64", "--format", "json")
    assert result.returncode == 0, result.stderr
    table = json.loads(result.stdout)
    measured = {(m["world_size"], m["mode"]): m for m in table["measured"]}
    data = read_json(out / "compare.json")
    [merging] = [t["dedup"] for t in data["tensors"] if t.get("dedup")]
    merged_modes = {"dedup"} | {"auto" for t in data["tensors"] if t.get("auto_decision") == "dedup"}
    for row in table["rows"]:
        seen = measured.get((row["world_size"], row["mode"]))
        if not seen:
            continue
        if row["mode"] in merged_modes and row["world_size"] > 1:
            # merged: U varies by rank and step, the prediction takes the largest (N x U_max rows)
            spread = row["world_size"] * (merging["distinct_rows_max"] - merging["distinct_rows_min"]) \
                * (TINY.d_model * 4 + 8)
            assert 0 <= row["collective_bytes_per_rank"] - seen["collective_bytes_per_rank"] <= spread
        else:
            assert row["collective_bytes_per_rank"] == seen["collective_bytes_per_rank"]
    at64 = {r["mode"]: r for r in table["rows"] if r["world_size"] == 64}
    assert at64["sparse"]["gathered_bytes_per_rank"] > at64["dense"]["gathered_bytes_per_rank"] == 0


def test_an_injected_wrong_reduction_fails_the_verification(runs_root):
    # GIVEN densified gradients that are summed instead of averaged
    out = runs_root / "compare-fault"
    result = memdiag("compare", "sparse-vs-dense", "transformer", "-n", "2", "--modes", "sparse,dense",
                     "--steps", "2", "--inject-fault", "sum-densified", "--out", str(out))
    # THEN the comparison fails and says where
    assert result.returncode == 1
    c = read_json(out / "compare.json")["correctness"]
    assert c["passed"] is False and c["reduction"]["passed"] is False
    assert c["reduction"]["max_rel_diff"] > 0.4  # a sum over 2 ranks is twice the average
    # AND the parameters fail too, rounding's allowance for the update included
    assert [check["passed"] for check in c["checks"] if check["mode"] == "dense"] == [False]
    assert c["update_allowance"] is not None and c["update_allowance"] < 0.01
    assert "Correctness FAILED" in result.stdout
    assert "finished N=2 sparse" in result.stderr  # progress, without --quiet
    # AND the second look, the dense run again with MPI's allreduce in rank order, does not excuse it
    [dense] = [check for check in c["checks"] if check["mode"] == "dense"]
    assert dense["rank_order"]["run"] == "verify-order-n2-dense" and dense["rank_order"]["passed"] is False
    # nor does the distance between the two dense runs: the re-run is as wrong, so they agree with each other
    assert dense["rank_order"]["spread"]["within"] is False
    assert dense["rank_order"]["spread"]["max_abs_diff"] < dense["max_abs_diff"] / 10
    again = read_json(out / "verify-order-n2-dense" / "run.json")
    assert " ".join(again["command"]).count("--mca coll_tuned_allreduce_algorithm 1") == 1
    assert {r["run_dir"].rstrip("/").rsplit("/", 1)[-1] for r in read_json(out / "compare.json")["rows"]} == \
        {"n2-sparse", "n2-dense"}


def test_merging_that_drops_duplicates_fails_the_verification(runs_root):
    # GIVEN merged gradients that keep one row per index instead of summing the duplicates
    out = runs_root / "compare-drop"
    result = memdiag("compare", "sparse-vs-dense", "transformer", "-n", "2", "--modes", "sparse,dedup",
                     "--steps", "2", "--inject-fault", "drop-duplicates", "--out", str(out), "--quiet")
    # THEN the merged reduction check and dedup's parameters both fail; the dense check still passes
    assert result.returncode == 1
    c = read_json(out / "compare.json")["correctness"]
    assert c["passed"] is False
    by = c["reduction"]["by_reduction"]
    assert by["dedup"]["passed"] is False and by["dense"]["passed"] is True
    assert [check["passed"] for check in c["checks"] if check["mode"] == "dedup"] == [False]
    assert "Correctness FAILED" in result.stdout
    # AND --quiet left out the progress (a line per finished run, which the fault test's comparison prints)
    assert "finished" not in result.stderr and "Traceback" not in result.stderr
