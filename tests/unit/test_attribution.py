"""Attribution of memray's high-water-mark records to groups: rules, reconciliation, bad files,
the cache, and the rendering of the section."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from memdiag.analyze import attribution as attr
from memdiag.analyze.attribution import (
    ALLGATHER,
    ALLREDUCE,
    OTHER,
    PYTHON,
    STARTUP,
    TF_TENSORS,
    Attribution,
    Classifier,
    PeakRecord,
    attribute_file,
    attribute_records,
    attribute_run,
    short_stack,
    simplify,
)
from memdiag.report.attribution import attribution_section, flamegraph_command

MIB = 2**20


def native(*functions: str) -> tuple[tuple[str, str, int], ...]:
    return tuple((f, "<unknown>", 0) for f in functions)


# Stacks as memray gives them (innermost frame first), cut from real runs of the tiny Transformer.
TF_ALLOCATOR = ("tsl::port::AlignedMalloc(unsigned long, int)",
                "tensorflow::BasicCPUAllocator::Alloc(unsigned long, unsigned long, unsigned long*)",
                "tsl::BFCAllocator::Extend(unsigned long, unsigned long)",
                "tensorflow::Tensor::Tensor(tsl::Allocator*, tensorflow::DataType, tensorflow::TensorShape const&)",
                "tensorflow::OpKernelContext::allocate_tensor(tensorflow::DataType, tensorflow::TensorShape const&)",
                "tensorflow::OpKernelContext::allocate_output(int, tensorflow::TensorShape const&, "
                "tensorflow::Tensor**)")
ALLGATHER_STACK = native(*TF_ALLOCATOR, "AllocateOutput",
                         "horovod::common::AllgatherOp::AllocateOutput("
                         "std::vector<horovod::common::TensorTableEntry>&)",
                         "horovod::common::MPIAllgather::Execute(std::vector<horovod::common::TensorTableEntry>&)",
                         "PerformOperation", "RunLoopOnce", "BackgroundThreadLoop", "start_thread")
ADASUM_STACK = native("horovod::common::Adasum<ompi_communicator_t*>::Adasum(horovod::common::HorovodGlobalState*)",
                      "horovod::common::AdasumMPI::AdasumMPI(horovod::common::MPIContext*)",
                      "horovod::common::AdasumMPIAllreduceOp::AdasumMPIAllreduceOp(horovod::common::MPIContext*)",
                      "CreateOperationManager", "BackgroundThreadLoop", "start_thread")
MPI_INIT_STACK = native("<unknown>", "mca_btl_base_select", "ompi_mpi_init", "MPI_Init_thread",
                        "horovod::common::MPIContextManager::EnvInitialize(int)",
                        "horovod::common::MPIContext::Initialize(horovod::common::MPIContextManager&)",
                        "BackgroundThreadLoop")
FUSION_STACK = native(*TF_ALLOCATOR[:2], "tensorflow::OpKernelContext::allocate_temp(tensorflow::DataType)",
                      "TFPersistentBuffer", "_Construct<horovod::tensorflow::TFPersistentBuffer>", "AllocatePersistent",
                      "horovod::common::FusionBufferManager::InitializeBuffer(long, int)", "PerformOperation")
ALLREDUCE_OUTPUT_STACK = native(*TF_ALLOCATOR[3:],
                                "horovod::tensorflow::(anonymous namespace)::HorovodAllreduceOp::ComputeAsync("
                                "tensorflow::OpKernelContext*)", "tensorflow::ThreadPoolDevice::ComputeAsync")
TF_STACK = native(*TF_ALLOCATOR,
                  "tensorflow::BinaryOp<Eigen::ThreadPoolDevice, tensorflow::functor::mul<float> >::Compute("
                  "tensorflow::OpKernelContext*)", "tensorflow::ThreadPoolDevice::Compute") \
    + (("call", "memdiag/workloads/transformer.py", 98),)
PYTHON_STACK = (("_PyObject_ArenaMmap", "Objects/obmalloc.c", 152), ("new_arena", "Objects/obmalloc.c", 1641),
                ("_PyObject_Malloc", "Objects/obmalloc.c", 1998), ("r_object", "Python/marshal.c", 1121),
                ("_compile_bytecode", "<frozen importlib._bootstrap_external>", 729))
OTHER_STACK = native("operator new(unsigned long)",
                     "void absl::lts_20230125::container_internal::InitializeSlots<std::allocator<char>, 8ul>(int)",
                     "tensorflow::(anonymous namespace)::UniqueOp<int, int>::Compute(tensorflow::OpKernelContext*)")


@pytest.mark.parametrize("frames, group", [
    (ALLGATHER_STACK, ALLGATHER),
    (ADASUM_STACK, STARTUP),  # its AdasumMPIAllreduceOp frame must not make it an allreduce buffer
    (MPI_INIT_STACK, STARTUP),
    (FUSION_STACK, ALLREDUCE),
    (ALLREDUCE_OUTPUT_STACK, ALLREDUCE),  # allocated by TensorFlow's allocator, for Horovod
    (TF_STACK, TF_TENSORS),
    (PYTHON_STACK, PYTHON),
    (OTHER_STACK, OTHER),
    ((), OTHER),
])
def test_each_stack_lands_in_its_group(frames, group):
    assert Classifier().classify(PeakRecord(1, 1, frames))[0] == group


def test_python_allocator_records_are_python_objects_whatever_their_frames():
    # GIVEN a record memray tagged as pymalloc (it traces Python's allocator) with no frames
    record = PeakRecord(64, 1, (), allocator=2)
    # THEN it is a Python object
    assert Classifier().classify(record)[0] == PYTHON


def test_rules_are_data_first_match_wins():
    # GIVEN rules that put TensorFlow first: the allgather output becomes a TensorFlow tensor
    rules = ((TF_TENSORS, ("tsl::BFCAllocator",)), (ALLGATHER, ("AllgatherOp",)))
    assert Classifier(rules).classify(PeakRecord(1, 1, ALLGATHER_STACK))[0] == TF_TENSORS
    # AND with the shipped order it is the allgather's
    assert Classifier().classify(PeakRecord(1, 1, ALLGATHER_STACK))[0] == ALLGATHER
    groups = [group for group, _ in attr.RULES]
    assert len(groups) == len(set(groups)) and OTHER not in groups
    assert all(isinstance(p, str) and p for _, patterns in attr.RULES for p in patterns)


def test_simplify_drops_templates_arguments_and_return_types():
    assert simplify("horovod::common::AllgatherOp::AllocateOutput(std::vector<int>&, int)") == \
        "horovod::common::AllgatherOp::AllocateOutput"
    assert simplify("tensorflow::(anonymous namespace)::UniqueOp<int, int>::Compute(tensorflow::OpKernelContext*)") \
        == "tensorflow::UniqueOp::Compute"
    assert simplify("void absl::container_internal::InitializeSlots<std::allocator<char>, 8ul>(int)") == \
        "absl::container_internal::InitializeSlots"
    assert simplify("operator new(unsigned long)") == "operator new"


def test_short_stacks_name_what_allocated():
    classifier = Classifier()

    def short(frames):
        return short_stack(frames, classifier.classify(PeakRecord(1, 1, frames))[1])

    assert short(ALLGATHER_STACK) == ("horovod::common::AllgatherOp::AllocateOutput",
                                      "horovod::common::MPIAllgather::Execute")
    assert short(ADASUM_STACK) == ("horovod::common::Adasum::Adasum", "CreateOperationManager")
    assert short(FUSION_STACK) == ("TFPersistentBuffer", "horovod::common::FusionBufferManager::InitializeBuffer")
    # a pooled region is named as such, with the kernel whose tensor made the pool grow
    assert short(TF_STACK) == ("tsl::BFCAllocator::Extend", "tensorflow::BinaryOp::Compute",
                               "call (transformer.py:98)")
    assert short(PYTHON_STACK) == ("_PyObject_ArenaMmap",
                                   "_compile_bytecode (<frozen importlib._bootstrap_external>:729)")
    assert short(OTHER_STACK) == ("tensorflow::UniqueOp::Compute",)


def sample_records() -> list[PeakRecord]:
    return [
        PeakRecord(528 * MIB, 2, ALLGATHER_STACK),
        PeakRecord(128 * MIB, 1, ADASUM_STACK),
        PeakRecord(4 * MIB, 3, MPI_INIT_STACK),
        PeakRecord(128 * MIB, 1, FUSION_STACK),
        PeakRecord(512 * MIB, 1, TF_STACK),
        PeakRecord(3 * MIB, 9000, PYTHON_STACK),
        PeakRecord(1 * MIB, 7, PYTHON_STACK[2:]),
        PeakRecord(2 * MIB, 11, OTHER_STACK),
    ]


def test_groups_reconcile_with_the_peak_and_are_sorted():
    records = sample_records()
    total = sum(r.size for r in records)
    result = attribute_records(records, rank=3, file="rank-3.memray.bin", memray_peak_bytes=total)
    assert result.peak_bytes == result.memray_peak_bytes == total
    assert sum(g.bytes for g in result.groups) == total
    assert sum(g.share for g in result.groups) == pytest.approx(1.0)
    assert [g.group for g in result.groups] == [ALLGATHER, TF_TENSORS, STARTUP, ALLREDUCE, PYTHON, OTHER]
    assert result.group(STARTUP).bytes == 132 * MIB and result.group(STARTUP).allocations == 4
    assert result.group(PYTHON).top_stacks[0].bytes == 3 * MIB and len(result.group(PYTHON).top_stacks) == 2
    assert result.pooled_bytes == 528 * MIB + 512 * MIB  # both stacks went through BFCAllocator::Extend
    assert result.records == len(records)


def test_memray_figure_is_kept_beside_ours_even_when_they_differ():
    result = attribute_records(sample_records(), memray_peak_bytes=1)
    assert result.memray_peak_bytes == 1 and result.peak_bytes > 1


def test_a_difference_from_memrays_peak_warns_beyond_a_mebibyte():
    from memdiag.analyze.attribution import reconciliation_warning

    total = sum(r.size for r in sample_records())
    for off, warns in ((0, False), (2464, False), (-MIB, False), (MIB + 1, True), (-MIB - 1, True)):
        result = attribute_records(sample_records(), rank=1, memray_peak_bytes=total + off)
        warning = reconciliation_warning(result)
        assert (warning is not None) == warns, off
        if warns:
            assert warning == f"rank 1: groups add up to {total} bytes but memray's peak is {total + off} bytes"


def test_top_stacks_are_at_most_three_and_largest_first():
    records = [PeakRecord(size, 1, TF_STACK[:-1] + (("f", f"/app/m{size}.py", size),)) for size in range(1, 8)]
    group = attribute_records(records).group(TF_TENSORS)
    assert [s.bytes for s in group.top_stacks] == [7, 6, 5]


def test_python_frames_of_top_stacks_come_from_the_slow_hybrid_stack_only_for_those():
    calls = []

    def hybrid():
        calls.append(1)
        return TF_STACK

    # GIVEN two records with the same native stack, the larger one able to give its Python frames
    records = [PeakRecord(10, 1, TF_STACK[:-1], hybrid=hybrid),
               PeakRecord(1, 1, TF_STACK[:-1], hybrid=lambda: pytest.fail("only the largest record is asked"))]
    group = attribute_records(records).group(TF_TENSORS)
    assert group.top_stacks[0].frames[-1] == "call (transformer.py:98)" and len(calls) == 1
    assert group.top_stacks[0].bytes == 11


frames_strategy = st.sampled_from([ALLGATHER_STACK, ADASUM_STACK, FUSION_STACK, TF_STACK, PYTHON_STACK,
                                   OTHER_STACK, ()])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**34), st.integers(1, 100), frames_strategy), max_size=40))
def test_every_byte_is_in_exactly_one_group(items):
    records = [PeakRecord(size, n, frames) for size, n, frames in items]
    result = attribute_records(records)
    assert sum(g.bytes for g in result.groups) == sum(r.size for r in records) == result.peak_bytes
    assert all(g.bytes > 0 and 0 < g.share <= 1 for g in result.groups)
    assert len({g.group for g in result.groups}) == len(result.groups)
    assert all(sum(s.bytes for s in g.top_stacks) <= g.bytes for g in result.groups)


def test_attribution_survives_json():
    result = Attribution([attribute_records(sample_records(), rank=1, file="rank-1.memray.bin")], ["w"])
    again = Attribution.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again == result


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"\x00" * 100])
def test_a_damaged_memray_file_gives_a_warning_not_a_traceback(tmp_path, content):
    path = tmp_path / "rank-0.memray.bin"
    path.write_bytes(content)
    result, warnings = attribute_file(str(path), 0)
    assert result is None
    assert len(warnings) == 1 and "rank 0" in warnings[0] and "cannot be read" in warnings[0]


def test_a_run_whose_memray_files_are_damaged_still_reports(tmp_path):
    (tmp_path / "rank-0.memray.bin").write_bytes(b"not memray")
    (tmp_path / "rank-1.memray.bin").write_bytes(b"")
    entry = attr.summary_entry(str(tmp_path))
    assert entry["ranks"] == [] and len(entry["warnings"]) == 2
    text = render(entry)
    assert "warning: rank 0" in text and "warning: rank 1" in text


def test_a_run_without_memray_files_has_no_attribution(tmp_path):
    assert attribute_run(str(tmp_path)) is None and attr.summary_entry(str(tmp_path)) is None


def capture(path: Path, killed: bool = False) -> Path:
    """A small real memray capture with native stacks: a 64 MiB buffer held to the end. ``killed``:
    the process dies inside the tracker, as a rank killed by the OOM killer or by mpirun does."""
    code = ("import memray, os, signal, time\n"
            f"with memray.Tracker({str(path)!r}, native_traces=True):\n"
            "    held = bytearray(64 * 2**20)\n"
            "    start = time.time()\n"
            "    while time.time() - start < 0.3:  # enough records that memray flushes some\n"
            "        junk = [str(i) * 10 for i in range(20000)]\n"
            + ("    os.kill(os.getpid(), signal.SIGKILL)\n" if killed else ""))
    subprocess.run([sys.executable, "-c", code], timeout=120)
    return path


@pytest.fixture(scope="module")
def memray_file(tmp_path_factory) -> Path:
    return capture(tmp_path_factory.mktemp("memray") / "rank-0.memray.bin")


def test_a_real_memray_file_reconciles_with_memray(memray_file):
    result, warnings = attribute_file(str(memray_file), 0)
    assert warnings == []
    assert result.peak_bytes == result.memray_peak_bytes >= 64 * MIB
    assert sum(g.bytes for g in result.groups) == result.peak_bytes
    assert result.groups[0].bytes >= 64 * MIB


def test_a_killed_ranks_memray_file_warns_and_attributes_what_it_has(tmp_path):
    # GIVEN the file of a process killed while memray was tracking it (never closed, never compressed)
    path = capture(tmp_path / "rank-1.memray.bin", killed=True)
    result, warnings = attribute_file(str(path), 1)
    # THEN what was recorded is attributed, with a warning saying the file ends early
    assert len(warnings) == 1 and "rank 1" in warnings[0] and "ends early" in warnings[0]
    assert result.peak_bytes == sum(g.bytes for g in result.groups) > 0


def test_a_memray_file_cut_short_gives_a_warning(memray_file, tmp_path):
    # memray compresses a finished file: cut anywhere, it no longer reads as memray's
    data = memray_file.read_bytes()
    cut = tmp_path / "rank-0.memray.bin"
    cut.write_bytes(data[: len(data) * 2 // 3])
    result, warnings = attribute_file(str(cut), 0)
    assert result is None and "cannot be read" in warnings[0]


def test_the_cache_is_used_until_a_file_changes(memray_file, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-0.memray.bin").write_bytes(memray_file.read_bytes())
    first = attribute_run(str(run))
    assert (run / attr.CACHE_FILE).exists()
    # WHEN reading files is made impossible, the cache still answers
    monkeypatch.setattr(attr, "attribute_file", lambda *a: pytest.fail("read despite the cache"))
    assert attribute_run(str(run)) == first
    # AND a changed file is read again
    (run / "rank-0.memray.bin").write_bytes(b"damaged now")
    monkeypatch.setattr(attr, "attribute_file", lambda path, rank: (None, ["read again"]))
    assert attribute_run(str(run)).warnings == ["read again"]


def test_every_ranks_file_is_read_and_the_ranks_come_in_order(memray_file, tmp_path):
    # GIVEN three ranks' files, one of them damaged (read in parallel, one process per core)
    for rank in (0, 2):
        (tmp_path / f"rank-{rank}.memray.bin").write_bytes(memray_file.read_bytes())
    (tmp_path / "rank-1.memray.bin").write_bytes(b"oops")
    result = attribute_run(str(tmp_path), use_cache=False)
    assert [r.rank for r in result.ranks] == [0, 2] and [r.file for r in result.ranks][1] == "rank-2.memray.bin"
    assert result.ranks[0].groups == result.ranks[1].groups
    assert len(result.warnings) == 1 and result.warnings[0].startswith("rank 1: rank-1.memray.bin cannot be read")


def render(attribution: dict, width: int = 140) -> str:
    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system=None)
    console.print(attribution_section(attribution))
    return console.file.getvalue()


def test_the_section_shows_groups_per_rank_top_stacks_and_flame_graph_commands():
    ranks = [attribute_records(sample_records(), rank=r, file=f"rank-{r}.memray.bin") for r in (0, 1)]
    entry = {"dir": "/runs/x", **Attribution(ranks, []).as_dict()}
    text = render(entry)
    assert "What holds memory at the peak" in text and "rank 0" in text and "rank 1" in text
    table = text[:text.index("top stacks")]
    order = [table.index(name) for name in (ALLGATHER, TF_TENSORS, STARTUP, ALLREDUCE, PYTHON)]
    assert order == sorted(order)
    assert f"528 MiB {528 / 1306 * 100:.0f}%" in text and "memray's own peak" in text
    assert "horovod::common::AllgatherOp::AllocateOutput <- horovod::common::MPIAllgather::Execute" in text
    assert "rank 1: the same top stacks as rank 0" in text
    assert "flamegraph -f -o /runs/x/rank-0.flamegraph.html /runs/x/rank-0.memray.bin" in text
    assert "TF_ENABLE_ONEDNN_OPTS=0" in text  # the pooled regions are explained
    assert "Horovod averages gathered gradient values" in text


def test_without_an_allgather_output_or_pooled_regions_there_are_no_such_notes():
    records = [r for r in sample_records() if r.frames not in (ALLGATHER_STACK, TF_STACK)]
    text = render(Attribution([attribute_records(records, file="rank-0.memray.bin")], []).as_dict())
    assert "Horovod allgather output" not in text and "averages" not in text and "BFC" not in text
    assert "Flame graphs" not in text  # no directory known: no commands


def test_flamegraph_command_names_the_output_beside_the_file():
    command = flamegraph_command("/a b/rank-2.memray.bin")
    assert command.endswith("flamegraph -f -o '/a b/rank-2.flamegraph.html' '/a b/rank-2.memray.bin'")
