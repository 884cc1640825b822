"""Notebook 13 executed with papermill: a 2-stage PipelineModule (schedule, bubble, bytes between stages, losses
against one rank, ZeRO-1/2), Ulysses attention on 2 and 4 ranks, AutoTP, and ZeRO++ hpZ on 2 simulated nodes."""
import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.parallel import PipeZero, StageStream

NAME = "13_beyond_data_parallel"
pytestmark = pytest.mark.notebook


def test_pipeline_sequence_tensor_and_zeropp():
    m = run_notebook(NAME)
    rows = m["pipeline_bubble"]
    assert {(r["m"], r["stage"]) for r in rows} >= {(mb, s) for mb in (1, 2, 4, 8) for s in (0, 1)}
    for r in rows:              # the executed schedule idles 2(p − 1) of 2(m + p − 1) steps: the formula, exactly
        assert r["formula"] == pytest.approx(1 / (r["m"] + 1), abs=1e-3)
        assert r["step_share"] == pytest.approx(r["formula"], abs=1e-3)
        assert 0 < r["idle_share"] < 1
        assert r["in_flight"] == min(2 - r["stage"], r["m"])
    timed = {(r["m"], r["stage"]): r["idle_share"] for r in rows}
    assert abs((timed[(1, 0)] + timed[(1, 1)]) / 2 - 0.5) <= 0.1, "m = 1: each stage waits through the other's work"
    assert timed[(8, 0)] + timed[(8, 1)] < timed[(1, 0)] + timed[(1, 1)], "more micro-batches, a smaller bubble"
    assert m["pipeline_streams_match"] is True
    assert m["pipeline_p2p_bytes_match"] is True
    for r in m["pipeline_p2p_bytes"]:            # m × 128 × 256 × 4 bytes each way
        assert r.get("SendActivation", r.get("SendGrad")) == r["m"] * 128 * 256 * 4
    assert m["pipeline_loss_max_abs_diff"] <= m["pipeline_loss_tolerance"] <= 1e-5
    assert m["pipeline_zero1_error"] == ""
    assert "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" in m["pipeline_zero2_error"]
    state = {(r.stage, r.pipe_stage): r.optimizer_state_bytes / r.stage_parameters
             for r in as_records(m["pipeline_zero1_state"], PipeZero)}
    assert all(state[(0, s)] == pytest.approx(8) and state[(1, s)] == pytest.approx(4, rel=0.01) for s in (0, 1))
    parts = m["pipeline_partitions"]
    assert parts["uniform (as given)"][1] == 0 and min(parts["yours"]) >= 0.4 * sum(parts["yours"])
    assert m["ulysses_max_abs_diff"] <= 1e-5
    assert set(m["ulysses_alltoall_bytes"]) == {"2", "4"}
    for p, sent in m["ulysses_alltoall_bytes"].items():      # 4 all-to-alls of b·(s/p)·h elements, fp32
        assert sent == m["ulysses_alltoall_formula_bytes"][p] == 4 * 2 * 64 * 64 * 4 // int(p)
    assert "AutoTP not supported" in m["autotp_gpt2_cpu_error"]
    assert m["autotp_llama_logits_max_abs_diff"] <= 1e-5
    assert m["world_size_zeropp"] == 4
    assert m["hpz"][0]["intra-node share"] == pytest.approx(1 / 3, abs=1e-3)
    assert abs(m["hpz_intra_node_share"] - 0.6) <= 0.03
    assert m["hpz"][1]["from other node"] <= 0.5 * m["hpz"][0]["from other node"]
    assert "not been implemented on CPU" in m["qwz_cpu_error"] and "not been implemented on CPU" in m["qgz_cpu_error"]


def test_replay_with_equal_times_and_free_hand_overs_gives_the_formula():
    """The replay that splits the timed gap: DeepSpeed's own schedules with forward 1 and backward 2 on both stages."""
    from course_utils.rank import parallel as pp
    from course_utils.kernel.views.parallel import replayed_idle

    for m in (1, 2, 3, 8):
        records = []
        for stage in (0, 1):
            steps = pp.schedule(m, 2, stage)
            durations = [{"ForwardPass": 1.0, "BackwardPass": 2.0}.get(c.split("(")[0], 0.0) for s in steps for c in s]
            records.append({"name": StageStream.NAME, "rank": stage, "value": {
                "m": m, "stage": stage, "executed": steps, "scheduled": steps, "durations": durations}})
        assert replayed_idle(records, m) == pytest.approx({0: 1 / (m + 1), 1: 1 / (m + 1)})
