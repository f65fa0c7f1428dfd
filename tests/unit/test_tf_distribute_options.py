"""--engine tf-distribute: what it accepts for now, what it carries to the agent, and its ports."""

from __future__ import annotations

import os
import socket

import pytest

from memdiag._errors import UserError
from memdiag.agent.config import AgentConfig
from memdiag.cli import build_parser
from memdiag.launch import ports
from memdiag.launch.options import LaunchOptions
from memdiag.launch.session import RunRequest, agent_config, validate


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return str(path)


def test_the_engine_defaults_to_horovod_and_reaches_the_agent(script):
    args = build_parser().parse_args(["run", script, "-n", "2"])
    assert args.engine == "horovod"
    args = build_parser().parse_args(["run", script, "-n", "2", "--engine", "tf-distribute", "--mode", "dense"])
    request = RunRequest(args.target, args.world_size, args.mode, LaunchOptions.from_args(args, []),
                         engine=args.engine)
    config = agent_config(request, "abc", "run-dir")
    assert config.engine == "tf-distribute" and config.mode == "dense"
    assert AgentConfig.decode(config.encode()).engine == "tf-distribute"


def test_an_unknown_engine_is_refused_by_the_parser(script, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", script, "-n", "2", "--engine", "nccl"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--engine" in err and "tf-distribute" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mode", ["as-written", "sparse", "dense", "auto"])
def test_a_script_in_the_supported_modes_passes(script, mode):
    validate(RunRequest(script, 2, mode, engine="tf-distribute"))


@pytest.mark.parametrize("target", ["transformer", "mixed"])
@pytest.mark.parametrize("mode", [None, "as-written", "sparse", "dense", "auto"])
def test_the_transformer_and_mixed_workloads_in_the_supported_modes_pass(target, mode):
    request = RunRequest(target, 2, mode, LaunchOptions(preset="tiny", max_warmup=3), engine="tf-distribute")
    validate(request)
    config = agent_config(request, "abc", "run-dir")
    assert config.workload == target and config.engine == "tf-distribute" and config.max_warmup == 3
    assert config.mode == (mode or "sparse")  # a built-in workload's default: what its code does


@pytest.mark.parametrize("target, mode, options, message", [
    ("resnet50", None, {}, "not resnet50"),
    ("transformer", "dedup", {}, "not dedup"),
    ("mixed", None, {"hosts": "node1:1,node2:1"}, "--hosts is not supported"),
    ("transformer", None, {"horovod_timeline": True}, "needs --engine horovod"),
    ("SCRIPT", "dedup", {}, "not dedup"),
    ("SCRIPT", None, {"hosts": "node1:1,node2:1"}, "--hosts is not supported"),
    ("SCRIPT", None, {"horovod_timeline": True}, "needs --engine horovod"),
])
def test_what_the_engine_does_not_support_yet_is_a_one_line_error(script, target, mode, options, message):
    target = script if target == "SCRIPT" else target
    with pytest.raises(UserError, match=message) as exc:
        validate(RunRequest(target, 2, mode, LaunchOptions(**options), engine="tf-distribute"))
    assert "\n" not in str(exc.value)


def test_free_ports_are_distinct_and_free():
    chosen = ports.free_ports(4)
    assert len(chosen) == 4 and len(set(chosen)) == 4
    for port in chosen:
        assert 0 < port < 65536
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", port))  # released: a worker's server can bind it


def test_a_port_in_use_is_not_chosen():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("", 0))
        held.listen()
        taken = held.getsockname()[1]
        for _ in range(20):
            assert taken not in ports.free_ports(8)


def test_ports_travel_as_text_and_bad_text_is_refused():
    assert ports.free_ports(0) == []
    assert ports.decode(ports.encode([41001, 41002])) == [41001, 41002]
    with pytest.raises(ValueError):
        ports.decode("41001,70000")
    with pytest.raises(ValueError):
        ports.decode("41001,x")
    with pytest.raises(ValueError):
        ports.free_ports(-1)


def test_a_strategy_collective_record_carries_its_stage_and_padding_and_horovods_does_not(tmp_path):
    import json

    from memdiag.agent.records import RecordWriter
    from memdiag.agent.sampler import MemorySampler
    from memdiag.agent.tracer import Tracer

    writer = RecordWriter(str(tmp_path / "rank-0.jsonl"), 0)
    tracer = Tracer(writer, MemorySampler(), 0, auto_steps=False)
    tracer.begin_step(0)
    base = {"op": "allgather", "name": "table", "dtype": "float32", "itemsize": 4, "sparse": True,
            "densified": False, "reduce_op": "sum", "gradient": True}
    tracer.collective({**base, "part": "values", "engine": "tf-distribute", "stage": "values", "padded": True},
                      [1500, 256], [3000, 256], {"pad_in_bytes": 512_000, "pad_out_bytes": 512_000})
    tracer.collective({**base, "part": "values", "name": "horovod_table"}, [1000, 256], [2500, 256])
    tracer.end_step(0)
    writer.close()
    records = [r for r in map(json.loads, (tmp_path / "rank-0.jsonl").read_text().splitlines())
               if r["type"] == "collective"]
    strategy, horovod = records
    assert strategy["engine"] == "tf-distribute" and strategy["stage"] == "values" and strategy["padded"]
    assert strategy["pad_in_bytes"] == 512_000 and strategy["bytes_out"] == 3000 * 256 * 4
    assert not {"engine", "stage", "padded", "pad_in_bytes", "pad_out_bytes"} & set(horovod)


def test_only_modes_dense_and_auto_change_a_strategy_scripts_job(script):
    from memdiag.launch.session import changes_to_job

    assert changes_to_job(RunRequest(script, 2, "as-written", engine="tf-distribute")) == []
    assert changes_to_job(RunRequest(script, 2, "sparse", engine="tf-distribute")) == []
    [change] = changes_to_job(RunRequest(script, 2, "dense", engine="tf-distribute"))
    assert "densified" in change
    [change] = changes_to_job(RunRequest(script, 2, "auto", engine="tf-distribute"))
    assert "--mode auto" in change and "padded gather" in change


def test_the_agent_writes_tf_config_from_the_ports_and_keeps_the_users(monkeypatch):
    import json

    from memdiag.agent.main import _write_tf_config

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setenv("MEMDIAG_TF_PORTS", "41001,41002")
    written = _write_tf_config(1, 2)
    assert written["source"] == "memdiag"
    assert json.loads(written["value"]) == {"cluster": {"worker": ["localhost:41001", "localhost:41002"]},
                                            "task": {"type": "worker", "index": 1}}
    assert json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1
    # a TF_CONFIG already there is the user's
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}')
    kept = _write_tf_config(1, 2)
    assert kept["source"] == "environment" and os.environ["TF_CONFIG"].startswith('{"cluster": {"worker": ["h:1"]}')
    # no ports for every rank: a reason, no TF_CONFIG
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.setenv("MEMDIAG_TF_PORTS", "41001")
    assert "1 port(s) for 2 rank(s)" in _write_tf_config(0, 2)["error"] and "TF_CONFIG" not in os.environ



class _SettledRank:
    """A rank whose per-step peak is flat (settled from its second step), as the tracer keeps them."""

    def __init__(self) -> None:
        self.step_peaks: list[int] = []
        self.ran: list[int] = []
        self.on_step_end: list = []

    def begin_step(self, step: int) -> None:
        pass

    def end_step(self, step: int, **extra) -> None:
        if step >= 0:
            self.step_peaks.append(100 * 2**20)
            self.ran.append(step)


@pytest.mark.parametrize("other_settled, expected", [(True, [0, 1]), (False, [0, 1, 2, 3])])
def test_a_workloads_warm_up_is_agreed_by_the_contexts_function_never_horovods(monkeypatch, other_settled, expected):
    import sys
    import types

    from memdiag.workloads import loop

    def horovod(*args):
        raise AssertionError("Horovod's agreement used under --engine tf-distribute")

    monkeypatch.setitem(sys.modules, "memdiag.densify", types.SimpleNamespace(agree_max_rows=horovod))
    votes: list[int] = []

    def agree_max(value: int) -> int:  # a stand-in for MPI's max over this worker and another
        votes.append(value)
        return max(value, 0 if other_settled else 1)

    tracer = _SettledRank()
    ctx = loop.WorkloadContext(tracer=tracer, rank=0, size=2, steps=2, seed=1, preset="tiny", overrides={},
                               run_dir=None, check_params=False, max_warmup=2, engine="tf-distribute",
                               agree_max=agree_max)
    loop.train(ctx, variables=lambda: [], train_step=lambda step: 0.0, broadcast=None, items_per_step=1)
    assert tracer.ran == expected  # the other worker's "not yet" adds steps here too, up to --max-warmup
    assert votes and set(votes) == {0}  # this worker had settled: it voted 0 each time
