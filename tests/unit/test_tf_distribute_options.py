"""--engine tf-distribute: what it accepts for now, what it carries to the agent, and its ports."""

from __future__ import annotations

import os
import socket

import pytest

from memdiag import ports
from memdiag._errors import UserError
from memdiag.agentconfig import AgentConfig
from memdiag.cli import build_parser
from memdiag.launch.options import LaunchOptions
from memdiag.launch.session import RunRequest, agent_config, run_manifest, validate
from memdiag.policy import MODES


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


# What docs/reference/commands.md and docs/howto/mwms.md promise --engine tf-distribute runs, for now.
SUPPORTED_MODES = ["as-written", "sparse", "dense", "auto"]


@pytest.mark.parametrize("mode", SUPPORTED_MODES)
def test_a_script_in_the_supported_modes_passes(script, mode):
    # GIVEN a script under the engine in a supported mode
    request = RunRequest(script, 2, mode, engine="tf-distribute")
    # WHEN it is validated, THEN nothing is refused
    assert validate(request) is None
    # AND the ranks are told to run that script with that engine in that mode, and run.json says so
    config = agent_config(request, "abc", "run-dir")
    assert (config.script, config.workload, config.engine, config.mode) == (script, None, "tf-distribute", mode)
    assert AgentConfig.decode(config.encode()).mode == mode
    manifest = run_manifest(request, "abc", config, "mpirun")
    assert (manifest["engine"], manifest["mode"], manifest["workload"], manifest["world_size"]) == \
        ("tf-distribute", mode, "train", 2)


def test_the_modes_outside_the_supported_ones_are_refused_for_a_script(script):
    # GIVEN every mode memdiag knows; WHEN a script is validated under the engine in each
    refused = {}
    for mode in MODES:
        try:
            validate(RunRequest(script, 2, mode, engine="tf-distribute"))
        except UserError as exc:
            refused[mode] = str(exc)
    # THEN exactly those outside the supported ones are refused, with the ones to choose instead
    assert sorted(refused) == sorted(set(MODES) - set(SUPPORTED_MODES)) == ["dedup"]
    assert refused["dedup"] == "--engine tf-distribute supports --mode as-written, sparse, dense, auto for now, " \
                               "not dedup"


@pytest.mark.parametrize("target", ["transformer", "mixed"])
@pytest.mark.parametrize("mode", [None, "as-written", "sparse", "dense", "auto"])
def test_the_transformer_and_mixed_workloads_in_the_supported_modes_pass(target, mode):
    # GIVEN a built-in workload the engine runs, in a supported mode or none
    request = RunRequest(target, 2, mode, LaunchOptions(preset="tiny", max_warmup=3), engine="tf-distribute")
    # WHEN it is validated, THEN nothing is refused
    assert validate(request) is None
    # AND the ranks are told to run that workload's preset with the engine in that mode
    config = agent_config(request, "abc", "run-dir")
    assert config.workload == target and config.script is None and config.preset == "tiny"
    assert config.engine == "tf-distribute" and config.max_warmup == 3
    assert config.mode == (mode or "sparse")  # a built-in workload's default: what its code does
    manifest = run_manifest(request, "abc", config, "mpirun")
    assert (manifest["workload"], manifest["preset"], manifest["engine"], manifest["mode"]) == \
        (target, "tiny", "tf-distribute", mode or "sparse")


# (what is refused, what the error tells the user to do instead)
WORKLOAD_NOT_RUN = ("runs a training script or the workloads transformer, mixed for now, not resnet50",
                    "use --engine horovod for it")
MODE_NOT_RUN = ("not dedup", "supports --mode as-written, sparse, dense, auto")
TIMELINE = ("--horovod-timeline records Horovod's own timeline", "it needs --engine horovod")


@pytest.mark.parametrize("target, mode, options, says", [
    ("resnet50", None, {}, WORKLOAD_NOT_RUN),
    ("transformer", "dedup", {}, MODE_NOT_RUN),
    ("transformer", None, {"horovod_timeline": True}, TIMELINE),
    ("SCRIPT", "dedup", {}, MODE_NOT_RUN),
    ("SCRIPT", None, {"horovod_timeline": True}, TIMELINE),
])
def test_what_the_engine_does_not_support_yet_is_a_one_line_error(script, target, mode, options, says):
    # GIVEN a request the engine does not run yet
    target = script if target == "SCRIPT" else target
    request = RunRequest(target, 2, mode, LaunchOptions(**options), engine="tf-distribute")
    # WHEN it is validated, THEN it is refused in one line that says what is refused and what to do instead
    with pytest.raises(UserError) as exc:
        validate(request)
    message = str(exc.value)
    what, fix = says
    assert what in message and fix in message and "\n" not in message
    assert message.startswith("--engine tf-distribute") or message.startswith("--horovod-timeline")
    # AND the same request under Horovod passes: the engine is what refused it
    assert validate(RunRequest(target, 2, mode, LaunchOptions(**options), engine="horovod")) is None


@pytest.mark.parametrize("target", ["SCRIPT", "transformer", "mixed"])
def test_hosts_pass_with_the_engine(script, target):
    from memdiag.launch import mpirun

    # GIVEN 4 ranks under the engine on two hosts of 2 slots each
    request = RunRequest(script if target == "SCRIPT" else target, 4, None,
                         LaunchOptions(preset="tiny", hosts="node1:2,node2:2"), engine="tf-distribute")
    # WHEN it is validated, THEN nothing is refused
    assert validate(request) is None
    # AND run.json places ranks 0, 1 on node1 and 2, 3 on node2 (slots filled in order), and mpirun is given the hosts
    config = agent_config(request, "abc", "run-dir")
    manifest = run_manifest(request, "abc", config, "mpirun")
    assert manifest["engine"] == "tf-distribute" and manifest["hosts"] == "node1:2,node2:2"
    assert manifest["placement"] == ["node1", "node1", "node2", "node2"]
    command = mpirun.command(mpirun.Launch(4, [config.encode()], hosts=request.options.hosts))
    assert command[command.index("-H") + 1] == "node1:2,node2:2" and command[1:3] == ["-np", "4"]
    # AND hosts without a slot count that reads are still refused under the engine, with an example to follow
    bad = RunRequest(request.target, 4, None, LaunchOptions(preset="tiny", hosts="node1:two"), engine="tf-distribute")
    with pytest.raises(UserError, match="'node1:two' needs a positive slot count, e.g. node1:4"):
        validate(bad)


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

    from memdiag.agent.sampler import MemorySampler
    from memdiag.agent.tracer import Tracer
    from memdiag.format.writer import RecordWriter

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

    from memdiag.agent.rank_strategy import write_tf_config

    _without_tf_config(monkeypatch)
    monkeypatch.setenv("MEMDIAG_TF_PORTS", "41001,41002")
    written = write_tf_config(1, 2)
    assert written["source"] == "memdiag" and written["ports_by"] == "launcher"
    assert json.loads(written["value"]) == {"cluster": {"worker": ["localhost:41001", "localhost:41002"]},
                                            "task": {"type": "worker", "index": 1}}
    assert json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1
    # a TF_CONFIG already there is the user's
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}')
    kept = write_tf_config(1, 2)
    assert kept["source"] == "environment" and os.environ["TF_CONFIG"].startswith('{"cluster": {"worker": ["h:1"]}')
    # no ports for every rank: a reason, no TF_CONFIG
    monkeypatch.delenv("TF_CONFIG")
    monkeypatch.setenv("MEMDIAG_TF_PORTS", "41001")
    assert "1 port(s) for 2 rank(s)" in write_tf_config(0, 2)["error"] and "TF_CONFIG" not in os.environ



class _SettledRank:
    """A rank whose per-step peak is flat (settled once three steps are in), as the tracer keeps them."""

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


@pytest.mark.parametrize("other_settled, expected", [(True, [0, 1, 2]), (False, [0, 1, 2, 3, 4])])
def test_a_workloads_warm_up_is_agreed_by_the_contexts_agreement_never_horovods(monkeypatch, other_settled, expected):
    from memdiag import agreement
    from memdiag.workloads import loop

    def horovod(*args):
        raise AssertionError("Horovod's agreement used under --engine tf-distribute")

    monkeypatch.setattr(agreement, "for_horovod", horovod)
    votes: list[int] = []

    class OtherWorker:  # a stand-in for MPI's exchange between this worker and another
        rank, size = 0, 2

        def exchange(self, seq, payload, timeout_s):
            votes.append(payload[1])
            return [payload, (payload[0], 0 if other_settled else 1)]

    tracer = _SettledRank()
    ctx = loop.WorkloadContext(tracer=tracer, rank=0, size=2, steps=3, seed=1, preset="tiny", overrides={},
                               run_dir=None, check_params=False, max_warmup=2, engine="tf-distribute",
                               agreement=agreement.Agreement(OtherWorker()))
    loop.train(ctx, variables=lambda: [], train_step=lambda step: 0.0, broadcast=None, items_per_step=1)
    assert tracer.ran == expected  # the other worker's "not yet" adds steps here too, up to --max-warmup
    assert votes and set(votes) == {0}  # this worker had settled: it voted 0 each time


# --hosts: each rank's own address and port (memdiag.ports), exchanged by the agent.
URI = "355991552.0;tcp://10.1.2.3,172.17.0.1:45123;tcp6://[fd00::2]:54529"


def test_the_addresses_of_mpiruns_contact_uri_are_read_in_order():
    assert ports.hnp_addresses(URI) == ["10.1.2.3", "172.17.0.1"]
    assert ports.hnp_addresses("355991552.0;tcp://192.0.2.2:46533;tcp6://[fd00::2]:54529") == ["192.0.2.2"]
    assert ports.hnp_addresses("355991552.0;tcp6://[fd00::2]:54529") == []
    assert ports.hnp_addresses("") == []


def test_the_route_to_a_local_address_leaves_from_it_and_no_address_has_no_route():
    assert ports.route_address("127.0.0.1") == "127.0.0.1"
    assert ports.route_address("not an address") is None


def _routes(table):
    return lambda target: table.get(target)


def test_the_address_is_the_one_on_the_route_to_mpiruns_host():
    env = {ports.HNP_URI_ENV: URI}
    # another host: the first route that leaves from an address of its own, not the docker bridge it shares
    address, how = ports.own_address(env, _routes({"10.1.2.3": "10.1.2.9", "172.17.0.1": "172.17.0.1"}))
    assert address == "10.1.2.9" and "10.1.2.3" in how
    address, _ = ports.own_address(env, _routes({"10.1.2.3": "10.1.2.3", "172.17.0.1": "172.17.0.5"}))
    assert address == "172.17.0.5"
    # mpirun's own host (or simulated hosts sharing its network): its own address, the first one routed
    address, _ = ports.own_address(env, _routes({"10.1.2.3": "10.1.2.3", "172.17.0.1": "172.17.0.1"}))
    assert address == "10.1.2.3"
    address, _ = ports.own_address(env, _routes({"172.17.0.1": "172.17.0.1"}))
    assert address == "172.17.0.1"


def test_memdiag_tf_address_overrides_the_uri_and_a_bad_one_is_one_line():
    env = {ports.HNP_URI_ENV: URI, ports.ADDRESS_ENV: "192.168.7.1"}
    address, how = ports.own_address(env, _routes({"192.168.7.1": "192.168.7.4", "10.1.2.3": "10.1.2.9"}))
    assert address == "192.168.7.4" and ports.ADDRESS_ENV in how
    with pytest.raises(ValueError, match=ports.ADDRESS_ENV) as exc:
        ports.own_address(env, _routes({"10.1.2.3": "10.1.2.9"}))
    assert "\n" not in str(exc.value)


def test_without_a_uri_the_host_names_address_serves_and_without_one_the_error_names_what_to_set(monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "node7")
    monkeypatch.setattr(socket, "gethostbyname", lambda host: {"node7": "10.0.0.7"}[host])
    assert ports.own_address({}, _routes({})) == ("10.0.0.7", "host name node7")

    def unresolved(host):
        raise socket.gaierror("Name or service not known")

    monkeypatch.setattr(socket, "gethostbyname", unresolved)
    with pytest.raises(ValueError, match=f"set {ports.ADDRESS_ENV}") as exc:
        ports.own_address({ports.HNP_URI_ENV: URI}, _routes({}))
    assert "\n" not in str(exc.value) and "node7" in str(exc.value)


def test_a_held_port_cannot_be_bound_by_another_until_released():
    with ports.hold_free_port() as held:
        assert 0 < held < 65536
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other, pytest.raises(OSError):
            other.bind(("", held))  # another rank of this host cannot have it meanwhile
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", held))  # released: the worker's server can bind it


class _FakeWorld:
    """MPI.COMM_WORLD for one rank: its allgather returns the other ranks' entries around its own."""

    def __init__(self, rank, others):
        self.rank, self.others, self.sent = rank, others, None

    def allgather(self, mine):
        self.sent = mine
        return [*self.others[:self.rank], mine, *self.others[self.rank:]]


def _fake_mpi(monkeypatch, world):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=types.SimpleNamespace(COMM_WORLD=world)))


def test_with_hosts_the_agent_writes_tf_config_from_the_ranks_exchanged_addresses(monkeypatch):
    import json

    from memdiag.agent.rank_strategy import write_tf_config

    _without_tf_config(monkeypatch)
    monkeypatch.setenv(ports.ENV, ports.RANKS)
    monkeypatch.setenv(ports.ADDRESS_ENV, "127.0.0.1")
    world = _FakeWorld(1, [("10.1.2.9", 41001, "route"), ("10.1.2.10", 41003, "route")])
    _fake_mpi(monkeypatch, world)
    written = write_tf_config(1, 3)
    address, port, how = world.sent
    assert address == "127.0.0.1" and ports.ADDRESS_ENV in how
    assert json.loads(written["value"]) == {
        "cluster": {"worker": ["10.1.2.9:41001", f"127.0.0.1:{port}", "10.1.2.10:41003"]},
        "task": {"type": "worker", "index": 1}}
    assert os.environ["TF_CONFIG"] == written["value"]
    assert (written["ports_by"], written["address"], written["port"]) == ("ranks", "127.0.0.1", port)
    # a user's TF_CONFIG is kept, after taking part in the exchange all the same
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 0}}')
    world.sent = None
    assert write_tf_config(1, 3)["source"] == "environment" and world.sent is not None


def test_with_hosts_a_rank_without_an_address_or_a_repeated_worker_is_an_error_on_every_rank(monkeypatch):
    from memdiag.agent.rank_strategy import write_tf_config

    _without_tf_config(monkeypatch)
    monkeypatch.setenv(ports.ENV, ports.RANKS)
    monkeypatch.setenv(ports.ADDRESS_ENV, "127.0.0.1")
    _fake_mpi(monkeypatch, _FakeWorld(1, [(None, 41001, "no address found for this worker on node7: set X")]))
    error = write_tf_config(1, 2)["error"]
    assert error.startswith("rank 0: no address found") and "TF_CONFIG" not in os.environ
    _fake_mpi(monkeypatch, _FakeWorld(0, [("10.1.2.9", 41001, "route")]))
    monkeypatch.setattr(ports, "hold_free_port", _held(41001))
    monkeypatch.setattr(ports, "own_address", lambda: ("10.1.2.9", "route"))
    error = write_tf_config(0, 2)["error"]
    assert "same address and port twice" in error and ports.ADDRESS_ENV in error and "\n" not in error


def _held(port):
    import contextlib

    @contextlib.contextmanager
    def hold():
        yield port

    return hold


def _without_tf_config(monkeypatch) -> None:
    """No TF_CONFIG while the test runs, and after it the variable as it was: the code under test writes
    os.environ itself, which monkeypatch undoes only for a variable it recorded (setenv records it)."""
    monkeypatch.setenv("TF_CONFIG", "")
    monkeypatch.delenv("TF_CONFIG")
