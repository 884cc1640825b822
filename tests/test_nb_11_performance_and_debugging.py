"""Notebook 11 executed with papermill: the same updates under gradient accumulation, activation memory with and
without checkpointing, the flops profiler's count against GPT-2's matmuls, MFU, the step's time split, the monitor's
files and the stacks of a hung launch, asserted against what they must be."""
import importlib.util
import re
from pathlib import Path

import pytest

from conftest import run_notebook
from course_utils.common.record import as_records
from course_utils.common.records.perf import LoopUpdate, MicroStep
from course_utils.rank.models import PRESETS
from course_utils.kernel.views import perf

NAME = "11_performance_and_debugging"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)

    # 1 · 8 × 1, 4 × 2 and 2 × 4 gave the same losses; backward returned loss / 4, only the 4th step() updated
    assert m["accumulation_loop"] == "yours" and m["accumulation_max_abs_loss_diff"] <= 1e-5
    micro = as_records(m["accumulation_micro_steps"], MicroStep)
    assert [s.boundary for s in micro] == [False, False, False, True]
    assert [s.weights_changed for s in micro] == [False, False, False, True]
    assert all(abs(s.returned_over_loss - 0.25) < 1e-6 for s in micro)
    assert [s.global_steps for s in micro] == [0, 0, 0, 1]
    # the accumulation loops written by hand, against updates computed by hand (factor, left over): a PyTorch loop
    # ported as it is dies in ZeRO's step; a divided loss gives 1/4 of the update; engine.step() on every 4th
    # micro-batch one update in 16, from the last gradient alone; zero_grad() by hand leaves the last one's; the fix
    loops = {u.loop: u for u in as_records(m["accumulation_pitfalls"], LoopUpdate)}
    assert m["accumulation_pitfall_error"] == "KeyError: 0" and "self.averaged_gradients[i]" in loops["ported"].error
    assert loops["ported"].changed_after == [] and loops["ported"].global_steps == 0
    assert loops["divides"].changed_after == [4] and loops["divides"].fits["mean"] == pytest.approx([0.25, 0], abs=1e-5)
    assert loops["steps_every_gas"].changed_after == [16] and loops["steps_every_gas"].global_steps == 1
    assert loops["steps_every_gas"].fits["last"] == pytest.approx([0.25, 0], abs=1e-5)
    assert loops["zeroes"].fits["last"] == pytest.approx([0.25, 0], abs=1e-5) and loops["zeroes"].fits["mean"][1] > 0.1
    assert loops["steps_every_gas"].fits["mean"][1] > 0.1
    assert m["accumulation_fix_factor"] == pytest.approx(1.0, abs=1e-5) and loops["engines_own"].fits["mean"][1] < 1e-5
    assert loops["engines_own"].changed_after == [4] and loops["engines_own"].global_steps == 1

    # 2 · activations follow the tokens, checkpointing keeps less of them, and both checkpointings keep the same
    act = m["activation_peak_bytes"]
    assert set(act["off"]) == set(act["hf"]) and len(act["off"]) >= 4
    for point, off in act["off"].items():
        assert act["hf"][point] < off / 3, point
    per_token = {k: v / (int(k.split("x")[0]) * int(k.split("x")[1])) for k, v in act["off"].items()}
    assert max(per_token.values()) / min(per_token.values()) < 1.01, per_token
    assert set(act["deepspeed"]) == set(act["hf"]) and all(v == act["hf"][k] for k, v in act["deepspeed"].items())
    assert m["pass_peak_bytes"]["hf"] <= m["pass_peak_bytes"]["off"]     # equal while gradients and logits dominate
    # the timed passes: every setting timed in each interleaved round, their spread shown
    timing = {r["checkpointing"]: r for r in m["recompute_timing"]}
    assert {"off", "hf"} <= set(timing) and len({r["passes"] for r in timing.values()}) == 1
    assert all(0 < r["min ms"] <= r["median ms"] <= r["max ms"] for r in timing.values())

    # 3 · the profiler's forward count covers GPT-2's matmuls, plus its layer norms and biases (0.1 %); MFU < 1
    assert m["fwd_flops_by_hand"] <= m["fwd_flops"] <= 1.01 * m["fwd_flops_by_hand"]
    # the FLOPs of a step as this notebook's MFU counts them and as DeepSpeed's profile says (its printed factor)
    assert m["flops_per_step"] == m["deepspeed_flops_per_step"]
    assert 0 < m["mfu"] < 1

    # 4 · the engine's timers add up to the clock around forward + backward + step
    b = m["step_breakdown"]
    assert 0.8 * b["clock"] <= b["timers total"] <= 1.01 * b["clock"]
    assert all(b[k] > 0 for k in perf.BREAKDOWN)
    assert m["alpha_s"] > 0 and m["beta_s_per_byte"] > 0
    # the call in a step (the all-reduce itself + the wait for the last rank) < the engine's bwd_allreduce timer around
    # it (+ the copies outside the call); the parts add up to the timer. α–β's figure is a model fitted on timings of
    # shared cores: beside the call, not ordered with it (a busy machine can put it above)
    parts = m["grad_allreduce_parts_ms"]
    assert m["predicted_grad_allreduce_ms"] > 0 and parts["call"] < parts["timer"]
    assert parts["all-reduce itself"] > 0 and parts["waiting"] >= 0 and parts["outside the call"] > 0
    assert parts["all-reduce itself"] + parts["waiting"] + parts["outside the call"] == pytest.approx(parts["timer"])
    # the flops profiler profiled the step that began with global_steps == profile_step and titled it after its update
    assert m["profile_summary_step"] == m["profiled_row"] + 1

    # 5 · the csv_monitor wrote the loss (the script) and the learning rate (the engine) of every step
    assert {"Train_Samples_train_loss", "Train_Samples_lr", "Train_Samples_elapsed_time_ms_forward"} <= set(m["monitor_series"])
    assert m["monitor_loss_rows"] == m["monitor_lr_rows"] == m["profiled_steps"]
    assert m["monitor_loss"][-1] < m["monitor_loss"][0] - 1, "the profiled engine learns its counting sequences"

    # 6 · the hang: rank 0 waits in all_reduce inside log_metrics, rank 1 is past it, in the end-of-epoch barrier
    stacks = m["hang_stacks"]
    assert stacks["0"]["waiting in"] == "all_reduce" and "(log_metrics)" in stacks["0"]["script line"]
    assert stacks["1"]["waiting in"] == "barrier" and "(main)" in stacks["1"]["script line"]
    # TORCH_DISTRIBUTED_DEBUG=DETAIL's launch runs in `make course` only; a check in the notebook asserts what it reports
    assert "detail_mismatch_ops" not in m
    # the pitfall: the hang launch's env= reached every rank, and TORCH_CPP_LOG_LEVEL=INFO made c10d log in each
    sent = m["debug_env_sent"]
    assert {"CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "TORCH_CPP_LOG_LEVEL"} <= set(sent)
    assert len(m["debug_env_seen"]) >= 2 and all(seen == sent for seen in m["debug_env_seen"].values())
    assert set(m["c10d_info_lines"]) == set(m["debug_env_seen"]) and all(n > 0 for n in m["c10d_info_lines"].values())

    # 7 · real scale: each formula the projection uses reproduces this run's count; the projections say how they count
    agreement = m["scale_agreement"]
    assert len(agreement) == 7, [r["count"] for r in agreement]    # FLOPs, 2 step factors, the blocks, 3 activations
    assert all(r["within"] and abs(r["gap"]) <= r["tolerance"] <= 0.03 for r in agreement), \
        [r for r in agreement if not r["within"]]
    projections = m["scale_projections"]
    assert {p["hardware"] for p in projections} == {"1 × H100 80 GB", "8 × A100 40 GB"} and len(projections) == 8
    for p in projections:
        assert p["assumptions"]["MFU"] > 0 and p["assumptions"]["recompute counted"] and p["memory"]["activations"] > 0
        assert p["terms"] and all(t["count"] > 0 and t["rate"] > 0 and t["rate_says"] for t in p["terms"])
    off, on = ([p for p in projections if p["assumptions"]["recompute"] == 0], [p for p in projections if p["assumptions"]["recompute"] > 0])
    assert len(off) == len(on) == 4
    for a, b in zip(off, on):     # same set-up: checkpointing keeps less and computes more
        assert a["hardware"] == b["hardware"] and b["memory"]["activations"] < a["memory"]["activations"] / 5
        assert 1.1 < b["seconds"] / a["seconds"] < 4 / 3


def test_gpt2_matmul_count_matches_the_layers():
    """The hand count: a 1-layer GPT-2 of width d on one token of a 1-token sequence is 24·d² + 4·d + 2·d·V."""
    assert perf.gpt2_matmul_flops(1, 8, 10, 1, 1) == 24 * 64 + 4 * 8 + 2 * 8 * 10
    p = PRESETS["zero_lab"]
    assert perf.gpt2_matmul_flops(p.n_layer, p.n_embd, p.vocab_size, 2, 16) == \
        2 * perf.gpt2_matmul_flops(p.n_layer, p.n_embd, p.vocab_size, 1, 16)


def test_deepspeed_step_factor_reads_the_line_the_pinned_profiler_prints():
    """The factor is read from the profile DeepSpeed wrote; its line is built here from the installed source's own
    format string, so a change of wording in DeepSpeed fails this test rather than the notebook."""
    spec = importlib.util.find_spec("deepspeed")
    source = (Path(next(iter(spec.submodule_search_locations))) / "profiling/flops_profiler/profiler.py").read_text()
    template = re.search(r"f'(FLOPS per GPU = \{bwd_factor \+ 1:g\} \* fwd flops per GPU / iter latency: )'", source)
    assert template, "profiler.py no longer prints 'FLOPS per GPU = {bwd_factor + 1:g} * fwd flops per GPU / iter latency'"
    for recompute_fwd_factor in (0.0, 1.0):
        bwd_factor = 2 + recompute_fwd_factor
        line = template.group(1).replace("{bwd_factor + 1:g}", f"{bwd_factor + 1:g}") + "   2.08 GFLOPS"
        assert perf.deepspeed_step_factor(line) == 3 + recompute_fwd_factor
    with pytest.raises(ValueError, match="wall_clock_breakdown"):
        perf.deepspeed_step_factor("fwd flops per GPU: 3.56 G")


def test_profile_title_and_latencies_read_the_lines_the_pinned_profiler_prints():
    """The profile's title counts the steps completed (engine.global_steps after the profiled step's update), and its
    latencies are read in ms whatever unit DeepSpeed's duration_to_string chose; the lines come from the installed source."""
    from deepspeed.profiling.flops_profiler.profiler import duration_to_string

    spec = importlib.util.find_spec("deepspeed")
    root = Path(next(iter(spec.submodule_search_locations)))
    assert "print(f'Profile Summary at step {profile_step}:')" in (root / "profiling/flops_profiler/profiler.py").read_text()
    engine = (root / "runtime/engine.py").read_text()
    assert "profile_step=self.global_steps," in engine and "self.global_steps += 1" in engine
    text = "Profile Summary at step 3:\n" + "\n".join(
        f"{'{:<70}  {:<8}'.format(name + ' latency: ', duration_to_string(seconds))}"
        for name, seconds in (("fwd", 0.2091), ("bwd", 0.56378), ("step", 0.00021963), ("iter", 1.0252)))
    assert perf.profile_summary_step(text) == 3
    printed = perf.profile_latencies_ms(text)
    assert printed == pytest.approx({"fwd": 209.1, "bwd": 563.78, "step": 0.21963, "iter": 1030.0})
    assert all(perf.same_as_printed(ms, printed[k]) for k, ms in (("fwd", 209.1), ("bwd", 563.78), ("step", 0.21963),
                                                                   ("iter", 1025.2)))
    assert not perf.same_as_printed(1035.1, printed["iter"]) and not perf.same_as_printed(209.11, printed["fwd"])


def test_grad_allreduce_takes_the_last_rank_s_call_as_the_all_reduce_itself():
    """Two ranks, one step after the profiled one: rank 0's call of 200 ms holds 150 ms of waiting for rank 1, whose own
    call took 50 ms; the timers around the calls hold 60 and 40 ms more; rank 1's forward + backward was 140 ms longer."""
    from course_utils.common.record import plain
    from course_utils.common.records.perf import FlopsProfile, StepTime

    def step(rank, i, totals, timer, compute):
        comm = {"all_reduce": [[1000, [totals[0]]], [4, [totals[1]]]]}
        timers = {"bwd_allreduce": timer, "fwd": compute / 2, "bwd_inner": compute / 2}
        return {"name": StepTime.NAME, "rank": rank, "value": plain(StepTime(i, 0.0, timers, comm, 0.0))}

    records = [{"name": FlopsProfile.NAME, "rank": 0, "value": plain(FlopsProfile(0, 1, 1, 1, 1, [], 1.0, ""))},
               step(0, 0, (10.0, 12.0), 30.0, 100.0), step(0, 1, (212.0, 213.0), 260.0, 100.0),
               step(1, 0, (9.0, 10.0), 30.0, 100.0), step(1, 1, (60.0, 61.0), 90.0, 240.0)]
    grad = perf.grad_allreduce(records)
    assert grad.bytes == 1000 and grad.steps == [1]
    assert grad.parts() == pytest.approx({"all-reduce itself": 50.0, "waiting": 150.0, "call": 200.0,
                                          "outside the call": 60.0, "timer": 260.0})
    assert grad.longest_wait() == pytest.approx((1, 150.0, 140.0)) and grad.calls_outside_timer() == []


def test_streamed_lines_leave_out_the_cpp_core_s_info_lines_only():
    """A quiet launch's lines as the runner would have streamed them: c10d's INFO line goes, a warning of the C++ core
    and the rank's own lines stay; DeepSpeed's INFO chatter goes as the runner's filter says."""
    from types import SimpleNamespace

    log = "\n".join(["[rank 0] [I1128 18:58:51.479929236 socket.cpp:955] [c10d] The client socket has connected to x",
                     "[rank 0] [W1128 18:58:52.000000000 ProcessGroupGloo.cpp:1] a warning",
                     "[rank 0] [2026-11-28 18:58:50,123] [INFO] [comm.py:1] chatter",
                     "[rank 0] step 0: my loss 1.0"])
    assert perf.streamed_lines(SimpleNamespace(log=log)) == ["[rank 0] [W1128 18:58:52.000000000 ProcessGroupGloo.cpp:1] a warning",
                                                             "[rank 0] step 0: my loss 1.0"]


def test_per_call_ms_takes_differences_of_the_running_totals():
    """The comms logger's all_reduce timer adds every call, whatever its size: the gradient call of step 1 is its
    total minus the total of the call before it (step 0's small one); step 0's first call has no total before it."""
    from course_utils.common.record import plain
    from course_utils.common.records.perf import StepTime

    steps = [{"all_reduce": [[1000, [50.0]], [4, [58.0]]]}, {"all_reduce": [[1000, [260.0]], [4, [268.5]]]},
             {"all_reduce": [[1000, [330.0]], [4, [334.0]]]}]
    records = [{"name": StepTime.NAME, "rank": 0, "value": plain(StepTime(i, 0.0, {}, comm, 0.0))}
               for i, comm in enumerate(steps)]
    assert perf.per_call_ms(records, "all_reduce", 1000) == pytest.approx({1: 202.0, 2: 61.5})
    assert perf.per_call_ms(records, "all_reduce", 4) == pytest.approx({0: 8.0, 1: 8.5, 2: 4.0})
