"""Real scale's core: the hardware table, the real models on the meta device, the step-time model, and notebook 16's
projection exercise (a copier's and a misunderstanding's answers refused, without the course's figures in the text)."""
import re

import pytest

from course_utils.common.records.scale import MachineFigures
from course_utils.kernel.scale import machine, models, one_gpu, project, specs


def test_every_gpu_and_link_of_the_table_has_a_source_and_its_links_exist():
    for g in specs.gpus().values():
        assert g.source and g.host_link.source and g.gpu_link.source
        assert g.bf16_flops > 1e14 and g.memory_bytes >= 24e9
    assert specs.gpu("H100 80 GB").bf16_flops == 989e12          # half the datasheet's 1,979 "with sparsity"
    with pytest.raises(KeyError, match="RTX 4090 24 GB"):         # an unknown name lists the table's names
        specs.gpu("RTX 5090")


def llama_by_hand(h=4096, ff=14336, layers=32, heads=32, kv=8, vocab=128256) -> int:
    """Llama's parameters written out: embeddings and an untied LM head, per layer q and o (h²), k and v (h·h·kv/heads),
    the gated MLP (3·h·ff) and two RMSNorms, and the final norm."""
    per_layer = 2 * h * h + 2 * h * (h * kv // heads) + 3 * h * ff + 2 * h
    return 2 * vocab * h + layers * per_layer + h


def test_meta_device_counts_match_the_architecture_and_the_published_figures():
    assert models.size("Llama-3-8B shape").params == llama_by_hand() == 8_030_261_248
    mixtral = models.size("Mixtral-8x7B shape")
    # 7 more experts per layer, and the router (8 × 4096) that picks two of them
    assert mixtral.params == llama_by_hand(vocab=32000) + 32 * (7 * 3 * 4096 * 14336 + 8 * 4096)
    assert abs(mixtral.active_params - models.REAL_MODELS["Mixtral-8x7B shape"].active_published) < 0.05e9
    for name in models.REAL_MODELS:
        assert abs(models.published_gap(name)) <= 1, f"{name}: the meta count is off its published figure"
    assert models.size("GPT-2 XL").largest_param == 50257 * 1600             # the tied embedding


def test_a_projection_adds_its_terms_as_it_says():
    m = models.size("Llama-3-8B shape")
    gpu = specs.gpu("A100 80 GB")
    p = project.step(m, gpu, gpus=8, stage=3, tokens_per_gpu=4096, mfu=0.5)
    forward = 2 * m.matmul_params * 4096 + 4 * 32 * 4096 * 4096 * 4096
    compute = 3 * forward / (312e12 * 0.5)
    wire = 3 * 7 / 8 * m.params * 2 / (300e9 * 0.8)
    assert p.seconds == pytest.approx(max(compute, wire))
    assert p.memory["device"] == pytest.approx(16 * m.params / 8)
    one = project.step(m, gpu, gpus=1, stage=2, offload_optimizer=True, cpu_adam_s_per_param_core=4e-9, host_cores=16)
    adam = next(t for t in one.terms if t.name == "CPU Adam")
    assert adam.seconds == pytest.approx(m.params * 4e-9 / 16)
    assert one.seconds == pytest.approx(sum(t.seconds for t in one.terms))      # nothing overlaps on one GPU
    with pytest.raises(ValueError, match="cpu_adam_s_per_param_core"):
        project.step(m, gpu, offload_optimizer=True)


def figures(**over) -> MachineFigures:
    base = dict(threads=2, matmul_flops_s=1e11, matmul_n=1024, copy_bytes_s=2e10, copy_bytes=2**28,
                cpu_adam_s_per_param=2e-9, cpu_adam_params=16_000_000, disk_write_bytes_s=1e9, disk_read_bytes_s=2e9,
                disk_bytes=2**28, others_cores=0.0)
    return MachineFigures(**{**base, **over})


def test_this_machine_projects_a_toy_step_from_its_own_figures():
    f = figures()
    assert f.cpu_adam_s_per_param_core == 4e-9
    plain = machine.toy_step("no ZeRO", f, 1000, 900, 32, 2, 16, 16, False, False, False)
    assert plain.seconds == pytest.approx(3 * (2 * 900 * 32 + 4 * 2 * 16 * 16 * 32) / 1e11 + 1000 * 2e-9)
    nvme = machine.toy_step("NVMe", f, 1000, 900, 32, 2, 16, 16, True, True, True)
    # fp32 master weights and moments, the fp32 gradients swapped out in backward, the parameters (bf16 on a CPU) read
    # for forward and for backward: notebook 16's keys keep none in host memory
    reads = 12 * 1000 + 4 * 1000 + 2 * 2 * 1000
    assert next(t for t in nvme.terms if t.name == "NVMe").seconds == pytest.approx(reads / 2e9)


def course_figures() -> dict:
    return one_gpu._course(one_gpu.SCENARIO)


def by_hand() -> dict:
    xl = models.size("GPT-2 XL")
    psi, n, tokens = xl.params, 8, 8 * 1024
    forward = 2 * xl.matmul_params * tokens + 4 * xl.layers * xl.tokens_per_sample * xl.hidden * tokens
    return {"device_gb": (2 * psi + 14 * psi / n) / 1e9,
            "step_seconds": max(3 * forward / (312e12 * 0.45), 3 * (n - 1) / n * psi * 2 / (300e9 * 0.8))}


def test_the_projection_exercise_takes_a_worked_answer_and_refuses_a_copier_and_a_misunderstanding():
    assert one_gpu.exercise_problem(by_hand()) is None
    expected = course_figures()
    rows, _ = one_gpu.eight_b_on_24gb(4e-9)
    lora = rows[-1]
    copied = {"device_gb": lora["model states on the GPU GB"], "step_seconds": lora["projected s/step"]}
    xl = models.size("GPT-2 XL")
    whole = {**by_hand(), "device_gb": 16 * xl.params / 1e9}               # ZeRO-2 divides nothing
    forward_only = {**by_hand(), "step_seconds": by_hand()["step_seconds"] / 3}   # a forward's FLOPs for a step
    for answer in (copied, whole, forward_only):
        said = one_gpu.exercise_problem(answer)
        assert said, answer
        numbers = {float(x) for x in re.findall(r"\d+(?:\.\d+)?", said)}
        assert not numbers & {round(v, k) for v in expected.values() for k in range(4)}, said
    assert "keys" in one_gpu.exercise_problem({"device_gb": 1.0})

    def calls_the_course():
        return project.step(models.size("GPT-2 XL"), "A100 40 GB", 8)
    assert "yourself" in one_gpu.exercise_problem(by_hand(), calls_the_course)

    def reads_the_check():
        return one_gpu._course(one_gpu.SCENARIO)
    assert "yourself" in one_gpu.exercise_problem(reads_the_check(), reads_the_check)

    def renames_the_course():               # no name of the course's projection in its source: caught by running it
        from course_utils.kernel.scale.project import step as count_it
        p = count_it(models.size("GPT-2 XL"), "A100 40 GB", 8, stage=2, tokens_per_gpu=8 * 1024, mfu=0.45)
        return {"device_gb": p.memory["device"] / 1e9, "step_seconds": p.seconds}
    assert "yourself" in one_gpu.exercise_problem(renames_the_course(), renames_the_course)


def test_an_8b_model_on_one_24gb_gpu():
    rows, projections = one_gpu.eight_b_on_24gb(4e-9)
    by = {r["configuration"]: r for r in rows}
    assert not by["no ZeRO"]["fits"] and by["no ZeRO"]["model states on the GPU GB"] == pytest.approx(16 * 8.030261248)
    assert by["ZeRO-3 + offload (CPU)"]["fits"] and by["ZeRO-3 + offload (CPU)"]["host GB"] >= 16 * 8.03
    lora = next(r for n, r in by.items() if n.startswith("LoRA"))
    # r·(in + out) for q, k, v, o in 32 layers: q and o are 4096 → 4096, k and v 4096 → 1024
    assert lora["trainable parameters"] == 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024))
    assert lora["fits"] and lora["projected s/step"] < by["ZeRO-3 + offload (CPU)"]["projected s/step"]
    for p in projections:
        record = p.record()
        assert record["terms"] and all(t["rate_says"] and t["count"] > 0 for t in record["terms"])
        assert record["assumptions"]["MFU"] == project.MFU
