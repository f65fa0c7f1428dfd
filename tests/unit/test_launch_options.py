"""One set of launch options: every option given to a study reaches every run of it, and the agent."""

from __future__ import annotations

import dataclasses

import pytest

from memdiag._errors import UserError
from memdiag.agentconfig import AgentConfig
from memdiag.cli import build_parser
from memdiag.launch.options import DEFAULTS, LaunchOptions
from memdiag.launch.session import RunRequest, agent_config
from memdiag.launch.studies import CompareRequest, ScaleRequest

# A value for every option that differs from its default.
NON_DEFAULT = dict(steps=7, preset="small", overrides={"d_model": "16"}, script_args=("--lr", "0.1"), margin=1.5,
                   seed=99, hosts="hostA:2,hostB:2", timeout_s=120.0, mem_limit_bytes=3 << 30, spool="local",
                   memray=True, horovod_timeline=True, threads_per_rank=2, sample_interval_s=0.01, max_warmup=6,
                   launcher="srun", record_every_s=0.5)


def test_the_table_of_non_default_values_covers_every_option():
    names = {f.name for f in dataclasses.fields(LaunchOptions)}
    assert set(NON_DEFAULT) == names
    assert all(getattr(DEFAULTS, k) != v for k, v in NON_DEFAULT.items())


def _changed(before: LaunchOptions, after: LaunchOptions) -> set[str]:
    return {f.name for f in dataclasses.fields(LaunchOptions) if getattr(before, f.name) != getattr(after, f.name)}


def test_every_option_of_a_comparison_reaches_each_measured_run():
    options = LaunchOptions(**NON_DEFAULT)
    request = CompareRequest("transformer", [1, 2], ["sparse", "dense"], options)
    run = request.run_request(2, "dense", "out")
    assert run.options == options and run.mode == "dense" and run.world_size == 2


def test_the_verification_run_changes_only_what_it_must():
    options = LaunchOptions(**NON_DEFAULT)
    check = CompareRequest("transformer", [1, 2], ["sparse"], options).check_request(2, "out")
    assert check.check_reduction
    assert _changed(options, check.options) == {"steps", "memray", "mem_limit_bytes", "max_warmup"}
    assert check.options.max_warmup == 0  # one step, measured by nobody: no warm-up
    assert check.options.steps == 1 and check.options.mem_limit_bytes is None


def test_every_option_of_a_scaling_study_reaches_each_run_including_the_memory_limit():
    # `scale --mem-limit` used to be accepted and dropped on the way to the runs.
    options = LaunchOptions(**{**NON_DEFAULT, "horovod_timeline": False})
    request = ScaleRequest("transformer", [1, 2], "weak", "dense", options)
    run = request.run_request(2, {"d_model": "32"}, "out")
    assert run.options.mem_limit_bytes == 3 << 30
    # A study always records Horovod's timeline, and sets each rank count's batch: nothing else changes.
    assert _changed(options, run.options) == {"overrides", "horovod_timeline"}


def test_the_command_line_fills_every_option(tmp_path):
    args = build_parser().parse_args([
        "scale", "transformer", "--weak", "--steps", "7", "--preset", "small", "--set", "d_model=16",
        "--margin", "1.5", "--seed", "99", "--hosts", "hostA:2,hostB:2", "--timeout", "120", "--mem-limit", "3G",
        "--spool", "local", "--memray", "--horovod-timeline", "--threads-per-rank", "2", "--max-warmup", "6",
        "--sample-ms", "10", "--launcher", "srun", "--record-every", "0.5"])
    options = LaunchOptions.from_args(args, ["--lr", "0.1"])
    assert _changed(LaunchOptions(**NON_DEFAULT), options) == set()


def test_the_agent_gets_each_option_it_uses_and_a_round_trip_keeps_them():
    options = LaunchOptions(**NON_DEFAULT)
    request = RunRequest("transformer", 2, "auto", options, fault="sum-densified", check_reduction=True)
    config = agent_config(request, "abc", "run-dir")
    for name in ("steps", "preset", "script_args", "margin", "seed", "spool", "memray", "mem_limit_bytes",
                 "threads_per_rank", "sample_interval_s", "max_warmup", "record_every_s"):
        assert getattr(config, name) == getattr(options, name), name
    assert config.overrides == {"d_model": "16"} and config.mode == "auto" and config.fault == "sum-densified"
    assert AgentConfig.decode(config.encode()) == config


def test_an_agent_config_from_another_version_is_refused_with_the_reason():
    import base64
    import json

    text = base64.urlsafe_b64encode(json.dumps({"run_id": "x"}).encode()).decode()
    with pytest.raises(ValueError, match="different memdiag versions"):
        AgentConfig.decode(text)


def test_options_are_frozen_and_a_study_cannot_change_another_runs_options():
    options = LaunchOptions(overrides={"d_model": "16"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.steps = 3  # type: ignore[misc]
    changed = dataclasses.replace(options, overrides={"d_model": "32"})
    assert options.overrides == {"d_model": "16"} and changed.overrides == {"d_model": "32"}


@pytest.mark.parametrize("bad, message", [
    (dict(steps=0), "--steps"), (dict(margin=0.0), "--margin"), (dict(spool="nfs"), "--spool"),
    (dict(hosts="node1:0"), "--hosts"), (dict(timeout_s=-1.0), "--timeout"),
    (dict(sample_interval_s=0.0005), "--sample-ms 0.5: give 1 to 1000"), (dict(sample_interval_s=2.0), "--sample-ms"),
    (dict(record_every_s=-1.0), "--record-every -1: give 0"), (dict(record_every_s=11.0), "--record-every 11"),
])
def test_bad_options_are_one_line_errors(bad, message):
    with pytest.raises(UserError, match=message):
        LaunchOptions(**bad).validate()


def test_ranks_sample_every_20_ms_unless_a_memory_limit_needs_its_watchdog_every_5():
    def period_ms(*argv: str) -> float:
        args = build_parser().parse_args(["run", "transformer", *argv])
        return LaunchOptions.from_args(args, []).sample_interval_s * 1000

    assert period_ms() == 20 and LaunchOptions().sample_interval_s == 0.02
    assert period_ms("--mem-limit", "2G") == 5 and LaunchOptions(mem_limit_bytes=2**31).sample_interval_s == 0.005
    # what the user asks is kept, with a limit or without
    assert period_ms("--sample-ms", "7") == 7 and period_ms("--mem-limit", "2G", "--sample-ms", "50") == 50


@pytest.mark.parametrize("argv", [["--record-every", "nan"], ["--record-every", "-1"], ["--record-every", "inf"],
                                  ["--sample-ms", "inf"], ["--sample-ms", "0"]])
def test_a_number_below_its_range_or_not_finite_is_refused_by_the_command_line(argv, capsys):
    with pytest.raises(SystemExit) as refused:
        build_parser().parse_args(["run", "transformer", *argv])
    assert refused.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_marks_are_made_records_once_a_second_unless_a_limit_or_a_node_local_spool_needs_every_step():
    def every(*argv: str) -> float | None:
        return LaunchOptions.from_args(build_parser().parse_args(["run", "transformer", *argv]), []).record_every_s

    assert every() == 1.0 == DEFAULTS.record_every_s
    assert every("--mem-limit", "2G") == 0.0  # the watchdog reads every sample as it is taken
    assert every("--spool", "local") == 0.0  # the marks' file would stay on the rank's node
    assert every("--mem-limit", "2G", "--record-every", "2") == 2.0  # asked: as asked
    assert every("--record-every", "0") == 0.0
