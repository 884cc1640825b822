"""course_utils.kernel.scale.offload and the formulas it checks (counts.offload_moved, nvme_moved, and the all-to-all
count notebook 15 hands it): each against counts written out by hand for a small case, without a launch."""
import json

import pytest

from course_utils.common.records.offload import Holding, Rung
from course_utils.kernel.scale import counts, models, offload, project


# ---------------------------------------------------------------- the formulas, small cases by hand

def test_offload_moved_counts_each_copy_of_the_source():
    # 8 parameters on 2 ranks: a partition of 4; 16-bit elements of 2 bytes, fp32 of 4
    assert counts.offload_moved(8, 2, True, False, 2) == {"to host": 16, "to device": 8}       # fp32 grads, bf16 params
    assert counts.offload_moved(8, 2, True, True, 2) == {"to host": 24, "to device": 24}       # + round trip, 2 gathers
    assert counts.offload_moved(8, 2, True, False, 2, stage=3) == {"to host": 24, "to device": 16}
    assert counts.offload_moved(8, 2, False, True, 2) == {"to host": 8, "to device": 16}
    assert counts.offload_moved(8, 2, False, False, 2) == {"to host": 0, "to device": 0}


def test_nvme_moved_counts_states_gradients_and_parameters_beyond_max_in_cpu():
    # a partition of 4: 3 fp32 tensors (48 bytes) read and written, fp32 gradients (16 bytes) written and read back
    assert counts.nvme_moved(8, 2, False) == {"read": 64, "write": 64}
    assert counts.nvme_moved(8, 2, True, 2, swapped_grads=1) == {"read": 52, "write": 52}   # params all in host memory
    # max_in_cpu 1: 3 parameter elements on NVMe, 2 bytes each, read twice and written once
    assert counts.nvme_moved(8, 2, True, 2, max_in_cpu=1) == {"read": 76, "write": 70}


def sent(experts, capacity, hidden, ep, b):
    """Notebook 15's count, as its section 4 writes it: two all-to-alls of E·C·h elements, (ep − 1)/ep of each leaves."""
    return 2 * experts * capacity * hidden * b * (ep - 1) / ep


def test_no_course_module_holds_the_all_to_all_count():
    assert not hasattr(counts, "all_to_all_sent"), "notebook 15's exercise 1 asks for it: no module may answer it"


def test_the_swap_threshold_and_defaults_are_deepspeeds():
    from deepspeed.runtime.swap_tensor.constants import AIO_BLOCK_SIZE_DEFAULT
    from deepspeed.runtime.swap_tensor.utils import MIN_AIO_BYTES
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadParamConfig

    assert offload.MIN_SWAP_BYTES == max(MIN_AIO_BYTES, AIO_BLOCK_SIZE_DEFAULT)
    import inspect
    default = inspect.signature(counts.nvme_moved).parameters["max_in_cpu"].default
    assert default == DeepSpeedZeroOffloadParamConfig().max_in_cpu


def test_swapped_numel_keeps_partitions_of_a_mebibyte():
    numels = [2**20, 10, 2**19 + 1]            # partitions on 2 ranks: 2**19, 5, 2**18 + 1
    assert offload.swapped_numel(numels, 2, 4) == 2**19 + 2**18 + 1
    assert offload.swapped_numel(numels, 2, 2) == 2**19          # in 2-byte elements the third is under 1 MiB


def test_the_parameter_swapper_is_bf16_where_fp16_is_not_supported():
    assert offload.parameter_swapper_bytes("fp32", "cuda") == 4
    assert offload.parameter_swapper_bytes("fp16", "cuda") == 2
    assert offload.parameter_swapper_bytes("fp32", "cpu") == (4 if offload.fp16_supported("cpu") else 2)


# ---------------------------------------------------------------- the count check on hand-made rungs

def _rung(name, held, nvme_bytes=0, optimizer="DeepSpeedCPUAdam", kernel=0.0):
    return Rung(name=name, rank=0, dtype="fp32", step_seconds=1.0, accelerator="cpu", model_state_bytes=0,
                device_bytes=0, host_bytes=0, accelerator_side_bytes=0, host_side_bytes=0, nvme_bytes=nvme_bytes,
                held=[Holding(state, structure, "cpu", size, 1, side) for state, structure, size, side in held],
                accelerator_peak=0, gathered_in_forward=0, persistent_numel=0, optimizer=optimizer, loss=0.0,
                phases={"forward + backward": 0.5, "engine.step()": 0.5, "optimizer kernel": kernel})


# a model of 8 parameters (one of 8 elements) on 2 ranks, fp32: a partition of 4 elements, 16 bytes
LADDER = {
    "stage 2 + offload": _rung("stage 2 + offload", [
        ("grads", "DeepSpeedCPUAdam.param_groups[i]['params'][i].grad", 16, "host"),
        ("grads", "DeepSpeedZeroOptimizer.temp_grad_buffer_for_cpu_offload", 40, "host"),    # allocated, never copied to
        ("buffers", "DeepSpeedZeroOptimizer.param_buffer_of_bit16_for_cpu_offload_groups[i]", 16, "host")]),
    "stage 3 + offload": _rung("stage 3 + offload", [
        ("grads", "DeepSpeedZeroOptimizer_Stage3.grad_partitions_flat_buffer", 16, "host"),
        ("grads", "DeepSpeedZeroOptimizer_Stage3.fp32_partitioned_groups_flat[i].grad", 16, "host"),
        ("params", "module parameter.ds_tensor", 16, "host"),
        ("optimizer", "DeepSpeedZeroOptimizer_Stage3.fp32_partitioned_groups_flat[i]", 16, "host"),
        ("optimizer", "DeepSpeedCPUAdam.state[p]['exp_avg']", 16, "host"),
        ("optimizer", "DeepSpeedCPUAdam.state[p]['exp_avg_sq']", 16, "host")]),
    "stage 3 + NVMe": _rung("stage 3 + NVMe", [], nvme_bytes=48),     # partitions under 1 MiB: the 3 states only
}


def test_offload_agreement_reads_the_structures_each_copy_uses():
    rows = {r["count"].split(":")[0]: r for r in offload.offload_agreement(LADDER, 8, 2, [8])}
    measured = {k: r["measured"] for k, r in rows.items()}
    assert measured == {"stage 2 + offload, to host": 16, "stage 2 + offload, to device": 16,
                        "stage 3 + offload, to host": 32, "stage 3 + offload, to device": 48,
                        "stage 3 + offload, on the host": 48, "stage 3 + NVMe, swap files": 48}
    assert all(r["within"] for r in rows.values()), rows


def test_offload_agreement_fails_when_a_partition_is_not_where_the_formula_says():
    wrong = dict(LADDER, **{"stage 3 + offload": _rung("stage 3 + offload", [
        ("grads", "DeepSpeedZeroOptimizer_Stage3.fp32_partitioned_groups_flat[i].grad", 16, "host"),
        ("params", "module parameter.ds_tensor", 16, "host")])})         # no 16-bit gradient buffer on the host
    rows = {r["count"].split(":")[0]: r for r in offload.offload_agreement(wrong, 8, 2, [8])}
    assert not rows["stage 3 + offload, to host"]["within"] and not rows["stage 3 + offload, to device"]["within"]


# ---------------------------------------------------------------- DeepSpeedCPUAdam's rate

def test_cpu_adam_rate_is_the_median_per_parameter_and_core():
    rungs = [_rung("a", [], kernel=0.001), _rung("b", [], kernel=0.002), _rung("c", [], kernel=0.003),
             _rung("torch", [], optimizer="AdamW", kernel=1.0)]
    median, each = offload.cpu_adam_rate(rungs, 1e6, 2)
    assert median == pytest.approx(4e-9) and set(each) == {"a", "b", "c"}
    with pytest.raises(ValueError, match="DeepSpeedCPUAdam"):
        offload.cpu_adam_rate(rungs[3:], 1e6, 2)


def test_kernel_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert offload.kernel_cores(2, gpu=False) == 4          # the course gives CPU ranks cores ÷ ranks
    assert offload.kernel_cores(1, gpu=True) == 8           # OpenMP's default: every core
    assert offload.kernel_cores(2, gpu=True) == 4           # two ranks stepping at once share them
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert offload.kernel_cores(2, gpu=False) == 3


# ---------------------------------------------------------------- the projections

def test_offload_projections_and_their_table():
    ps = offload.offload_projections(1e-9)
    assert [p.hardware for p in ps] == ["1 × RTX 4090 24 GB"] * 3 + ["8 × H100 80 GB"] * 3
    for p in ps:
        assert offload.missing(p.record()) == []
        adam = next(t for t in p.terms if t.name == "CPU Adam")
        gpus = int(p.hardware.split(" ")[0])
        assert adam.seconds == pytest.approx(8_030_261_248 / gpus * 1e-9 / project.HOST_CORES_PER_GPU)
        assert 0 < offload.offload_share(p) < 1
    # ZeRO-3 + offload moves 12 bytes a parameter over the host link, ZeRO-2 + offload_optimizer 6 (bf16)
    transfers = {p.label.split(", ")[1]: next(t.count for t in p.terms if t.name == "offload transfers") for p in ps[:3]}
    assert transfers["ZeRO-2 + offload_optimizer"] == pytest.approx(6 * 8_030_261_248)
    assert transfers["ZeRO-3 + offload (CPU)"] == pytest.approx(12 * 8_030_261_248)
    table = offload.offload_table(ps)
    assert len(table) == 6 and (table["offload's share"] > 0).all()
    assert len(project.terms_table(ps)) == sum(len(p.terms) for p in ps)
    assert any(s.startswith("NVMe PCIe 4.0") for s in offload.sources(ps))


def test_nvme_projection_keeps_the_gradient_partition_in_host_memory():
    """Under ZeRO-3 + NVMe the host keeps the gradient partition (stage 3 allocates it whole there,
    ``grad_partitions_flat_buffer``; notebook 16 measures it on the host side) and the 16-bit parameters up to
    ``max_in_cpu``; the drive holds the rest of the host side and the fp32 gradient copy backward swaps out."""
    llama = models.size("Llama-3-8B shape")
    psi = llama.params
    cpu = project.step(llama, "RTX 4090 24 GB", offload_optimizer=True, offload_param=True, cpu_adam_s_per_param_core=1e-9)
    nvme = project.step(llama, "RTX 4090 24 GB", offload_optimizer=True, offload_param=True, nvme=True,
                        cpu_adam_s_per_param_core=1e-9, max_in_cpu=1e9)
    assert cpu.memory["host"] == pytest.approx(16 * psi)                # bf16 parameters and gradients, fp32 Adam
    assert nvme.memory["host"] == pytest.approx(2 * 1e9 + 2 * psi)      # kept parameters + the bf16 gradient partition
    assert nvme.memory["nvme"] == pytest.approx(2 * (psi - 1e9) + 12 * psi + 4 * psi)
    assert "offload" in nvme.assumptions["overlap"]
    assert "offload" not in project.step(llama, "H100 80 GB", gpus=8).assumptions["overlap"]


def test_missing_names_what_a_record_lacks():
    record = project.Projection("x", "1 × H100 80 GB", [project.Term("compute", 0.0, "FLOP", 1.0, "")],
                                {"MFU": 0.4}).record()
    assert offload.missing(record) == ["assumption 'link efficiency'", "assumption 'overlap'", "term 'compute': count",
                                       "term 'compute': source"]


def _size(**kw):
    base = dict(name="toy", params=0, largest_param=0, largest_layer=0, embedding_params=0, expert_params=800,
                experts=4, top_k=1, layers=2, hidden=8, tokens_per_sample=16)
    fields = set(models.Size.__dataclass_fields__)
    return models.Size(**{k: v for k, v in {**base, **kw}.items() if k in fields})


def test_moe_step_counts_by_hand():
    # 4 experts of 100 parameters in each of 2 layers; 16 tokens a GPU, top-1, capacity factor 1: C = 4
    c = offload.moe_step_counts(_size(), 16, 1.0, ep=2, sent=sent, b=2)
    assert c["capacity"] == 4 and c["one expert"] == 100
    # per layer and forward: a buffer of 4·4·8 elements, 2 bytes, half of it sent, twice: 256; × 2 passes × 2 layers
    assert c["sent"] == 1024
    # 16 capacity slots × 2 FLOPs × 100 parameters × 2 layers, × 3 for forward and backward
    assert c["expert flops"] == 19200


def test_mixtral_projections():
    ps = offload.moe_projections(sent)
    assert len(ps) == 8 and all(offload.missing(p.record()) == [] for p in ps)
    one_expert = 3 * 4096 * 14336                         # w1, w2, w3 of one Mixtral expert
    c = offload.moe_step_counts(models.size("Mixtral-8x7B shape"), 4096, 1.25, 8, sent)
    assert c["one expert"] == one_expert and c["capacity"] == 1280          # ⌈4096 / 8 · 2 · 1.25⌉
    assert c["sent"] == pytest.approx(32 * 2 * 2 * 8 * 1280 * 4096 * 2 * 7 / 8)
    table = offload.moe_table(ps)
    h100 = table.loc["8 × H100 80 GB"]
    assert (h100.loc[(1.0, "NVLink 4 (H100)"), "all-to-all s"] * 9 ==
            pytest.approx(h100.loc[(1.0, "InfiniBand NDR 400 Gb/s"), "all-to-all s"], rel=0.01))
    assert h100.loc[(1.25, "NVLink 4 (H100)"), "all-to-all's share"] == pytest.approx(
        h100.loc[(1.0, "NVLink 4 (H100)"), "all-to-all's share"], abs=0.002)


def _layout(rank, ep, forward, experts=4, k=1, factor=1.0, label=None):
    value = dict(label=label or f"4 experts, ep_size {ep}", world_size=2, rank=rank, experts=experts, ep_size=ep, k=k,
                 capacity_factor=factor, ffn=64, hidden=32, tokens=64, local_experts=[], expert_numel=0, dense_numel=0,
                 one_expert_numel=0, ep_group=list(range(ep)), expert_dp_group=[],
                 alltoall={size: 2 * n for size, n in forward.items()}, alltoall_forward=forward, capacity=0)
    return json.loads(json.dumps({"name": "moe_layout", "value": value, "rank": rank}))


def test_alltoall_agreement_against_logged_messages():
    # ep 2, E 4, C 16, h 32, fp32: 2 messages of 8192 bytes logged in a forward, of which each rank sends half
    records = [_layout(0, 1, {}), _layout(0, 2, {"8192": 2}), _layout(1, 2, {"8192": 2})]
    rows = offload.alltoall_agreement(sent, records)
    assert [(r["formula"], r["measured"], r["within"]) for r in rows] == [(8192, 8192, True)] * 2      # both ranks
    [short] = offload.alltoall_agreement(sent, [_layout(0, 2, {"4096": 2})])        # half the bytes logged: refused
    assert not short["within"]
