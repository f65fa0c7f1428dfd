"""The verdict's words on auto against the fixed modes, measured without a sparse run (memdiag compare
--modes dense,auto): the gap to the best fixed mode and whether it is beyond the noise, and a growth
that was not measured said to be unmeasured, not absent."""

from __future__ import annotations

from memdiag.report.compare import physics_parts, verdict

MiB = 2**20


def _physics(auto_minus_best: float, beyond: bool) -> dict:
    return {"largest_world_size": 4, "dense_peak_bytes": 1320 * MiB, "auto_densified": ["words"],
            "auto_vs_sparse": None, "auto_minus_best_bytes": auto_minus_best, "best_fixed_mode": "dense",
            "auto_vs_best_beyond_noise": beyond, "phases": {"auto": {"4": "compute"}}, "lowest_peak_mode": "dense"}


def test_auto_above_the_best_fixed_mode_beyond_the_noise_is_said_without_a_sparse_run():
    [_, auto, _] = physics_parts(_physics(77 * MiB, True))
    assert "77 MiB above dense beyond the noise" in auto and "set in the compute phase" in auto


def test_auto_within_the_noise_of_the_best_fixed_mode_is_level_with_it():
    [_, auto, _] = physics_parts(_physics(10 * MiB, False))
    assert auto.endswith("level with dense within noise")


def test_without_a_sparse_run_the_growth_is_unmeasured_and_what_auto_kept_gathered_is_named():
    result = {"rows": [{"mode": m, "world_size": 4, "status": "ok"} for m in ("dense", "auto")],
              "tensors": [{"name": "model/items:0", "growth_bytes_per_rank": None, "auto_decision": "sparse",
                           "auto_reason": "allgather 8 MiB < dense 122 MiB"},
                          {"name": "model/words:0", "growth_bytes_per_rank": None, "auto_decision": "dense",
                           "auto_reason": "dense 8 MiB < allgather 257 MiB"}],
              "correctness": {"checks": [], "passed": None}}
    text = verdict(result).plain
    assert "Growth with the rank count not measured: no sparse run" in text and "auto kept items" in text
    assert "No collective output grows" not in text


def test_a_table_handed_dense_to_the_optimizer_is_counted_and_what_auto_weighed_said():
    physics = {**_physics(6 * MiB, True), "auto_dense_to_optimizer": ["model/items:0"]}
    [_, auto, _] = physics_parts(physics)
    assert "and handed 1 gathered dense to the optimizer" in auto
    assert "the optimizer's update as measured in one process" in auto
    assert "not what the rest of the step does" not in auto
    [_, plain, _] = physics_parts(_physics(6 * MiB, True))
    assert "handed" not in plain and "not what the rest of the step does" in plain


def test_the_tensor_entry_carries_what_auto_handed_the_optimizer():
    from memdiag.analyze.compare import growth_tensors

    policy = {"name": "items", "decision": "sparse", "reason": "r", "optimizer_input": "dense"}
    summaries = {(4, "auto"): {"policy": [policy, {"name": "words", "decision": "dense", "reason": "r"}],
                               "collectives": []}}
    tensors = {t["name"]: t for t in growth_tensors(summaries)}
    assert tensors["items"]["auto_optimizer_input"] == "dense"
    assert "auto_optimizer_input" not in tensors["words"]


def _level_result(dense: int, auto: int, sparse: int, noise: int) -> dict:
    rows = [{"world_size": 4, "mode": m, "status": "ok", "steady_peak_rss_bytes_median": v}
            for m, v in (("dense", dense), ("auto", auto), ("sparse", sparse))]
    return {"rows": rows, "growth_bytes_per_rank": {}, "tensors": [], "noise_bytes": noise, "noise_source": "ranks",
            "predicted_growth_bytes_per_rank": None}


def test_modes_within_the_noise_of_the_lowest_peak_are_named_together_whichever_is_lower():
    from memdiag.analyze.physics import physics

    # GIVEN auto and dense 10 MiB apart at N=4, one way round and then the other, with 50 MiB of noise
    for dense, auto in ((1000, 1010), (1010, 1000)):
        p = physics(_level_result(dense * MiB, auto * MiB, 1300 * MiB, 50 * MiB), {})
        # THEN both are named, in the same order either way, and sparse (300 MiB above) is not
        assert p["lowest_peak_modes_within_noise"] == ["auto", "dense"]
        assert p["lowest_peak_mode"] == ("dense" if dense < auto else "auto")
        assert "lowest peak at N=4: auto and dense, level within noise" in physics_parts(p)
    # AND beyond the noise, the lowest alone is named
    p = physics(_level_result(1000 * MiB, 1100 * MiB, 1300 * MiB, 50 * MiB), {})
    assert p["lowest_peak_modes_within_noise"] == ["dense"]
    assert "lowest peak at N=4: dense" in physics_parts(p)
    # AND without a noise figure, as before: the lowest
    p = physics({**_level_result(1000 * MiB, 1010 * MiB, 1300 * MiB, 0), "noise_bytes": None}, {})
    assert p["lowest_peak_modes_within_noise"] is None and "lowest peak at N=4: dense" in physics_parts(p)
