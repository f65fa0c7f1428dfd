"""The alpha-beta projection: ring formulas, fusion, the fit to the probe, weak and strong efficiency."""

import json

import pytest

from memdiag._errors import UserError
from memdiag.analyze import projection as model
from memdiag.formula import MPI_COUNT_LIMIT, SparseGradientShape, dense_bytes, gathered_bytes

NET = model.Network(alpha_s=1e-5, beta_bytes_per_s=1e9, source="test")
FUSION = 64 * 1024**2
# One dense gradient of 400 MB and one embedding: 100 rows per rank of 1000 float32 (4000 B) with
# int32 indices, in a table of 10000 rows (dense 40 MB); 1 s of compute for 100 items per rank.
EMB = SparseGradientShape(rows_per_rank=100, row_bytes=4000, index_bytes=4, dense_rows=10000, row_elements=1000)
BASE = model.ProjectionBase(run_dir="n2", world_size=2, items_per_rank=100, compute_s=1.0,
                            dense_allreduce_bytes=(400_000_000,), sparse={"emb": EMB})


def test_ring_allreduce_matches_the_hand_computed_time():
    # 2(n-1) a + 2(n-1)/n S/b with n=4, S=1e6, a=1e-6, b=1e9: 6e-6 + 1.5e-3
    net = model.Network(1e-6, 1e9, "test")
    assert model.ring_allreduce_s(4, 1e6, net) == pytest.approx(6e-6 + 1.5e-3, rel=1e-12)
    assert model.ring_allreduce_s(1, 1e9, net) == 0.0


def test_ring_allgather_moves_n_times_the_per_rank_input():
    # (n-1) a + (n-1)/n (n s)/b with n=4, s=1e6: 3e-6 + 3e-3 (a formula using s instead of n s gives 7.5e-4)
    net = model.Network(1e-6, 1e9, "test")
    assert model.ring_allgather_s(4, 1e6, net) == pytest.approx(3e-6 + 3e-3, rel=1e-12)
    assert model.ring_allgather_s(4, 1e6, net, messages=2) == pytest.approx(6e-6 + 3e-3, rel=1e-12)
    assert model.ring_allgather_s(1, 1e6, net) == 0.0


def test_fusion_packs_tensors_in_order_up_to_the_threshold():
    assert model.fuse([30, 30, 30, 100], 64) == [60, 30, 100]
    assert model.fuse([30, 30, 30], 0) == [30, 30, 30]  # fusion off: one message per tensor
    assert model.fuse([], 64) == []


def test_weak_scaling_at_10_and_1000_ranks_matches_the_hand_computed_model():
    points = {(p.mode, p.world_size): p for p in model.project(BASE, [10, 1000], NET, FUSION) if p.scaling == "weak"}
    # N=10, dense: allreduces of 4e8 and the densified 4e7 (two fusion buffers):
    #   2 x 2*9*1e-5 + 2*9/10 * 4.4e8/1e9 = 0.00036 + 0.792 = 0.79236
    dense10 = points[("dense", 10)]
    assert dense10.cost.communication_s == pytest.approx(0.79236, rel=1e-9)
    assert dense10.efficiency == pytest.approx(1 / 1.79236, rel=1e-9)
    # N=10, sparse: allreduce of 4e8 (0.00018 + 0.72) and two allgathers of 100 x 4004 B per rank
    #   (2*9*1e-5 + 9/10 * 10 * 400400/1e9 = 0.00018 + 0.0036036)
    sparse10 = points[("sparse", 10)]
    assert sparse10.cost.communication_s == pytest.approx(0.72018 + 0.00018 + 0.0036036, rel=1e-9)
    assert sparse10.efficiency == pytest.approx(1 / 1.7239636, rel=1e-9)
    # N=1000, dense: 2 x 2*999*1e-5 + 2*999/1000 * 0.44 = 0.03996 + 0.87912
    assert points[("dense", 1000)].efficiency == pytest.approx(1 / (1 + 0.91908), rel=1e-9)
    # N=1000, sparse: 0.01998 + 0.7992 (allreduce) + 0.01998 + 999 * 400400/1e9 (allgathers)
    assert points[("sparse", 1000)].efficiency == pytest.approx(1 / (1 + 0.83916 + 0.3999996), rel=1e-9)
    # The allgather overtakes the dense allreduce somewhere between 10 and 1000 ranks.
    assert sparse10.efficiency > dense10.efficiency
    assert points[("dense", 1000)].efficiency > points[("sparse", 1000)].efficiency


def test_projected_bytes_are_the_formula_bytes():
    points = {(p.mode, p.world_size): p for p in model.project(BASE, [1000], NET, FUSION) if p.scaling == "weak"}
    sparse, dense = points[("sparse", 1000)], points[("dense", 1000)]
    assert sparse.cost.gathered_bytes_per_rank == gathered_bytes(1000, 100, 4000, 4) == 400_400_000
    assert sparse.cost.collective_bytes_per_rank == 400_000_000 + 400_400_000
    assert dense.cost.gathered_bytes_per_rank == 0
    assert dense.cost.collective_bytes_per_rank == 400_000_000 + dense_bytes(10000, 4000)


def test_strong_scaling_divides_the_global_batch_of_the_smallest_rank_count():
    points = {(p.mode, p.world_size): p for p in model.project(BASE, [2, 8], NET, FUSION) if p.scaling == "strong"}
    assert points[("dense", 2)].efficiency == pytest.approx(1.0)
    # Global batch 2 x 100. At N=8: 25 items per rank, compute 0.25 s, 25 rows per rank.
    # dense: T(2) = 1 + 2*(2*1*1e-5) + 1 * 0.44 = 1.44004; T(8) = 0.25 + 2*(2*7*1e-5) + 1.75 * 0.44 = 1.02028
    dense8 = points[("dense", 8)]
    assert dense8.items_per_rank == 25 and dense8.cost.compute_s == pytest.approx(0.25)
    assert dense8.efficiency == pytest.approx(1.44004 * 2 / (1.02028 * 8), rel=1e-9)
    # sparse: T(2) = 1 + 0.40002 + (2e-5 + 400400/1e9) = 1.4004404
    #         T(8) = 0.25 + 0.70014 + (1.4e-4 + 7 * 25 * 4004/1e9) = 0.9509807
    assert points[("sparse", 8)].efficiency == pytest.approx(1.4004404 * 2 / (0.9509807 * 8), rel=1e-9)
    assert points[("sparse", 8)].cost.gathered_bytes_per_rank == gathered_bytes(8, 25, 4000, 4)


def test_mpi_count_limit_is_flagged_where_the_gathered_elements_pass_it():
    # 100 rows x 1000 elements per rank: the 32-bit count is passed above N = 21474
    limit_n = MPI_COUNT_LIMIT // (100 * 1000)
    points = {p.world_size: p for p in model.project(BASE, [limit_n, limit_n + 1], NET, FUSION)
              if p.scaling == "weak" and p.mode == "sparse"}
    assert not points[limit_n].cost.exceeds_mpi_count and points[limit_n + 1].cost.exceeds_mpi_count


def test_reference_transformer_sizes_put_dense_well_above_sparse_at_1200_ranks():
    # GIVEN the published configuration: vocab 33945, d_model 1024, 5000 tokens per rank, int32 ids;
    # the tied target embedding is dense, the source embedding an IndexedSlices gradient
    emb = SparseGradientShape(rows_per_rank=5000, row_bytes=4096, index_bytes=4, dense_rows=33945, row_elements=1024)
    base = model.ProjectionBase("ref", 2, 5000, 1.0, (33945 * 4096, 200_000_000), {"source": emb})
    net = model.Network(model.DEFAULT_ALPHA_S, model.DEFAULT_BETA_BYTES_PER_S, "default")
    result = model.projection_result(base, "transformer", [64, 400, 1200], net, FUSION)
    row = next(r for r in result["rows"] if r["world_size"] == 1200)
    # THEN every rank gathers 1200 x 5000 x 4100 B = 24.6 GB, past MPI's 32-bit count, and the
    # dense allreduce wins by a wide margin
    assert row["gathered_bytes_per_rank"] == 1200 * 5000 * 4100
    assert row["exceeds_mpi_count"]
    assert row["weak_dense_efficiency"] > row["weak_sparse_efficiency"] + 0.3
    assert [r["efficiency"] for r in row["references"]] == [0.91]
    assert next(r for r in result["rows"] if r["world_size"] == 400)["references"][0]["scaling"] == "strong"


def _probe_rows(alpha: float, beta: float) -> list[dict]:
    rows = []
    for n in (2, 4):
        for size in (1024, 1 << 20, 16 << 20):
            reduce_s = 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / beta
            gather_s = (n - 1) * alpha + (n - 1) / n * (n * size) / beta
            rows.append({"world_size": n, "op": "allreduce", "bytes_in": size, "bytes_out": size,
                         "time_us": reduce_s * 1e6})
            rows.append({"world_size": n, "op": "allgather", "bytes_in": size, "bytes_out": n * size,
                         "time_us": gather_s * 1e6})
    return rows


def test_network_fit_recovers_alpha_and_beta_from_probe_rows(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_probe_rows(3e-6, 5e9)))
    net = model.load_network(str(path))
    assert net.alpha_s == pytest.approx(3e-6, rel=1e-6)
    assert net.beta_bytes_per_s == pytest.approx(5e9, rel=1e-6)
    assert net.source == str(path)


def test_network_fit_needs_two_sizes_on_two_or_more_ranks(tmp_path):
    # One op at one size and rank count: latency and bandwidth cannot be told apart.
    one_size = [r for r in _probe_rows(3e-6, 5e9)
                if r["bytes_in"] == 1024 and r["world_size"] == 2 and r["op"] == "allreduce"]
    with pytest.raises(UserError, match="two sizes"):
        model.fit_network(one_size, "bench.json")
    with pytest.raises(UserError, match="two sizes"):
        model.fit_network([{**r, "world_size": 1} for r in _probe_rows(3e-6, 5e9)], "bench.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "rows"}')
    with pytest.raises(UserError, match="collective_bench"):
        model.load_network(str(bad))


def _summary(world_size=2, policy=True):
    collectives = [
        {"name": "m/emb:0", "op": "allgather", "part": "values", "sparse": True, "densified": False,
         "bytes_in_per_rank": 100 * 4000, "rows_in": 100, "calls_per_step": 1.0, "dtype": "float32"},
        {"name": "m/emb:0", "op": "allgather", "part": "indices", "sparse": True, "densified": False,
         "bytes_in_per_rank": 100 * 4, "rows_in": 100, "calls_per_step": 1.0, "dtype": "int32"},
        {"name": "m/kernel:0", "op": "allreduce", "part": None, "sparse": False, "densified": False,
         "bytes_in_per_rank": 4096, "rows_in": 32, "calls_per_step": 1.0, "dtype": "float32"},
    ]
    shape = {"local_rows": 100, "row_bytes": 4000, "index_bytes": 4, "dense_rows": 10000, "row_elements": 1000}
    return {"world_size": world_size, "collectives": collectives,
            "policy": [{"name": "m/emb:0", "decision": "sparse", **shape}] if policy else []}


def test_base_from_summary_takes_dense_allreduces_and_indexedslices_shapes():
    base = model.base_from_summary(_summary(), "n2", items_per_rank=100, compute_s=0.5)
    assert base.dense_allreduce_bytes == (4096,)
    assert base.sparse == {"m/emb:0": EMB}


def test_base_from_summary_refuses_one_rank_and_unknown_shapes():
    with pytest.raises(UserError, match="2 or more ranks"):
        model.base_from_summary(_summary(world_size=1), "n1", 100, 0.5)
    # no policy record: memdiag never saw the gathered tensor reduced as a gradient
    with pytest.raises(UserError, match="m/emb:0: .* no policy record names it"):
        model.base_from_summary(_summary(policy=False), "n2", 100, 0.5)
    # a policy record without rows (unknown when traced) and no record of them: the model's reason
    untraced = _summary()
    untraced["policy"][0].update(local_rows=None, rows_largest_rank=None)
    with pytest.raises(UserError, match="rows per rank were unknown when the graph was traced"):
        model.base_from_summary(untraced, "n2", 100, 0.5)


def test_projecting_at_another_batch_scales_compute_and_rows_but_not_dense_sizes():
    scaled = model.at_batch(BASE, 400)
    assert scaled.items_per_rank == 400 and scaled.compute_s == pytest.approx(4.0)
    assert scaled.sparse["emb"].rows_per_rank == 400 and scaled.sparse["emb"].dense_rows == 10000
    assert scaled.dense_allreduce_bytes == BASE.dense_allreduce_bytes


def test_one_rank_takes_dense_sizes_from_the_saved_parameters_less_the_indexedslices_ones():
    # Horovod runs no collective on one rank: the parameters give what would be allreduced
    parameters = {"m/emb:0": 10000 * 4000, "m/kernel:0": 4096, "m/bias:0": 128}
    base = model.base_from_summary(_summary(world_size=1), "n1", 100, 0.5, parameters)
    assert base.dense_allreduce_bytes == (4096, 128)
    assert base.sparse == {"m/emb:0": EMB}


def test_the_default_fusion_buffer_is_horovods_own_128_mib(monkeypatch):
    # Horovod 0.28.1 sets 128 MiB unless HOROVOD_FUSION_THRESHOLD says otherwise
    # (horovod/common/operations.cc, SetTensorFusionThresholdBytes(128 * 1024 * 1024)).
    from memdiag.cli import build_parser
    from memdiag.commands.scale import _projection_request

    assert model.DEFAULT_FUSION_BYTES == 128 * 1024**2
    monkeypatch.delenv("HOROVOD_FUSION_THRESHOLD", raising=False)
    args = build_parser().parse_args(["scale", "--from", "x", "--project", "64"])
    assert _projection_request(args).fusion_bytes == 128 * 1024**2
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", str(64 * 1024**2))
    assert _projection_request(args).fusion_bytes == 64 * 1024**2


@pytest.mark.parametrize("items", [True, False])
def test_projecting_a_run_whose_steps_record_no_items_is_a_one_line_error_not_a_traceback(items, tmp_path, capsys):
    # GIVEN a two-rank run whose steps record the items they hold (a built-in workload's), or none (a script's)
    from memdiag.analyze.summary import summarize
    from memdiag.cli import main
    from memdiag.format.reader import load_run
    from tests.unit.fake_run import make_run

    path = make_run(tmp_path / "run", items=items)
    (path / "summary.json").write_text(json.dumps(summarize(load_run(str(path)))))
    # WHEN it is projected to more ranks
    code = main(["scale", "--from", str(path), "--project", "4,8", "--step-compute", "0.1"])
    out = capsys.readouterr().out
    # THEN the script's run says in one line why it cannot be projected, with no traceback; the other run
    # gets past that point (this fake run records no policy, so the projection then stops at its gradient)
    assert code == 2 and "Traceback" not in out
    assert ("the run's steps record no items" in out) is not items
    assert items is False or "m/emb:0: this IndexedSlices gradient cannot be projected" in out
