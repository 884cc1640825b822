"""The learner's own GPU, without a GPU: which launches of 02, 12 and 15 take the one GPU of a described machine, which
model the lessons whose point is speed or memory train there (one rule, ``hardware.model_size``), and notebook 16's
limit and sizes at a GPU's scale. Decided for described 1- and 8-GPU machines (``hardware.describe``), as
tests/test_gpu_machines.py decides placement."""
from __future__ import annotations

import pytest

from course_utils.common import paths
from course_utils.kernel import hardware
from course_utils.rank import models, translation
from course_utils.tooling import gpu_table

H100, H200, RTX4090, A100_40 = ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GeForce RTX 4090",
                                "NVIDIA A100-SXM4-40GB")


def nb(stem: str):
    return next(paths.NOTEBOOKS.glob(f"{stem}_*.ipynb"))


# ---- the rule ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("name,gpt2,t5", [(RTX4090, "gpt2", "t5-small"), (A100_40, "gpt2", "t5-base"),
                                          (H100, "gpt2-medium", "t5-base"), (H200, "gpt2-large", "t5-large")])
def test_a_sized_lesson_trains_the_largest_published_shape_whose_states_fit_an_eighth_of_one_gpu(gpus, name, gpt2, t5):
    hw = hardware.describe(gpus, name)
    assert (hardware.model_size(hw), hardware.model_size(hw, "t5")) == (gpt2, t5)
    for family, size in (("gpt2", gpt2), ("t5", t5)):
        sizes = hardware.families()[family]
        states = {s: p.params * hardware.STATE_BYTES_PER_PARAM for s, p in sizes.items()}
        share = hw.gpu_memory_bytes * hardware.SIZED_SHARE
        assert states[size] <= share                                   # it fits ...
        bigger = list(sizes)[list(sizes).index(size) + 1:]
        assert all(states[s] > share for s in bigger)                  # ... and the next one would not
    assert hardware.sized_env(hw) == {models.SIZE_ENV: gpt2}
    line = hardware.size_line(hw, "the course's GPT-2")
    assert gpt2 in line and "an eighth" in line and f"{hw.gpu_memory_bytes / 1e9:.0f} GB" in line


def test_a_cpu_or_a_small_gpu_keeps_the_lesson_s_own_model():
    for hw in (hardware.describe(0, cores=2), hardware.describe(1, "NVIDIA T4", memory_gb=8)):
        assert hardware.model_size(hw) is None and hardware.sized_env(hw) == {}
        assert "the lesson's own size" in hardware.size_line(hw, "x")


@pytest.mark.parametrize("name,row", [(H100, "H100 80 GB"), ("NVIDIA H100 PCIe", "H100 80 GB"), (H200, "H200 141 GB"),
                                      ("NVIDIA A100-SXM4-80GB", "A100 80 GB"), (RTX4090, "RTX 4090 24 GB")])
def test_a_described_gpu_s_memory_comes_from_the_hardware_table(name, row):
    from course_utils.kernel.scale import specs

    assert specs.named_by(name).name == row
    assert hardware.describe(1, name).gpu_memory_bytes == int(specs.gpu(row).memory_bytes)


def test_a_gpu_the_table_cannot_name_asks_for_its_memory():
    from course_utils.kernel.scale import specs

    with pytest.raises(ValueError, match="memory_gb"):
        specs.named_by("NVIDIA A100-SXM4")          # 40 or 80 GB: the name does not say
    with pytest.raises(ValueError, match="memory_gb"):
        hardware.describe(1, "NVIDIA T4")


def test_the_counts_the_rule_reads_are_the_built_models():
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    for name, p in {**models.PRESETS, **models.GPU_SIZES}.items():
        with torch.device("meta"):
            built = models.tiny_gpt2("zero_lab", size=name) if name in models.GPU_SIZES else models.tiny_gpt2(name)
        assert models.count_parameters(built) == p.params, name
    for name, s in translation.T5_SIZES.items():
        config = T5Config(vocab_size=32128, d_model=s.d_model, d_kv=64, d_ff=s.d_ff, num_layers=s.layers,
                          num_decoder_layers=s.layers, num_heads=s.heads)
        with torch.device("meta"):
            assert sum(p.numel() for p in T5ForConditionalGeneration(config).parameters()) == s.params, name


def test_a_rank_builds_the_size_its_launch_was_given(monkeypatch):
    monkeypatch.setenv(models.SIZE_ENV, "gpt2-medium")
    assert models.preset("zero_lab") == models.preset("checkpoints") == models.GPU_SIZES["gpt2-medium"]
    assert models.preset("zero_lab", "gpt2") == models.GPU_SIZES["gpt2"]
    monkeypatch.setenv(models.SIZE_ENV, "gpt2-xxl")
    with pytest.raises(KeyError, match="names no GPU size"):
        models.preset("zero_lab")
    monkeypatch.delenv(models.SIZE_ENV)
    assert models.preset("zero_lab") == models.PRESETS["zero_lab"]
    with pytest.raises(KeyError, match="No T5 size"):
        translation.tiny_t5(None, size="t5-xxl")


# ---- where the launches go, and on which model ---------------------------------------------------------------------

@pytest.mark.parametrize("gpus", [1, 8])
def test_02_12_and_15_each_train_once_on_one_gpu(gpus):
    hw = hardware.describe(gpus, H100)
    for stem in ("02", "12", "15"):
        assert ("GPU", 1) in [(w, r) for w, r, _ in gpu_table.launches(nb(stem), hw, sized=True)], stem
    assert ("GPU", 1, "gpt2-medium") in gpu_table.launches(nb("12"), hw, sized=True)


@pytest.mark.parametrize("gpus", [1, 8])
def test_the_speed_and_memory_lessons_size_their_gpu_launches(gpus):
    """04, 10, 11 and 12 (and 03's one-device launch, on one GPU) give every launch that runs on the GPU the sized
    model; no launch on CPU ranks gets one (a GPT-2 medium on two CPU cores would take the lesson's whole time)."""
    hw = hardware.describe(gpus, H100)
    sized = {"04": "gpt2-medium", "10": "t5-base", "11": "gpt2-medium", "12": "gpt2-medium"}
    if gpus == 1:
        sized["03"] = "gpt2-medium"
    for stem, size in sized.items():
        found = gpu_table.launches(nb(stem), hw, sized=True)
        assert any(where == "GPU" and got == size for where, _, got in found), (stem, found)
    for stem in [f"{n:02d}" for n in range(17) if n != 14]:
        for where, _, got in gpu_table.launches(nb(stem), hw, sized=True):
            assert not (where == "CPU" and got), stem


def test_nothing_is_sized_on_a_cpu():
    laptop = hardware.describe(0, cores=2)
    for stem in [f"{n:02d}" for n in range(17) if n != 14]:
        assert all(got == "" for *_, got in gpu_table.launches(nb(stem), laptop, sized=True)), stem


# ---- notebook 16: the limit and the sizes at a GPU's scale ---------------------------------------------------------

def test_notebook_16_on_a_cpu_keeps_its_limit_and_sizes():
    from course_utils.kernel.views import bigger

    assert bigger.default_cap_mb(hardware.describe(0, cores=2)) == 352
    assert bigger.sizes_for(352, False) == (["11 M", "25 M"], ["11 M", "25 M"], ["48 M"])


@pytest.mark.parametrize("name", [RTX4090, A100_40, H100, H200])
def test_notebook_16_on_a_gpu_limits_an_eighth_of_it_and_sizes_to_that_limit(name):
    from course_utils.common.records.bigger import GPU_SIZES
    from course_utils.kernel.views import bigger

    hw = hardware.describe(1, name)
    cap = bigger.default_cap_mb(hw)
    assert cap == int(hw.gpu_memory_bytes / 8 / 2**20)
    plain, offload, nvme = bigger.sizes_for(cap, True)
    ratio = {s: 16 * bigger.parameters(s) / (cap * 2**20) for s in GPU_SIZES}
    assert set(plain + offload + nvme) <= set(GPU_SIZES)
    assert ratio[plain[0]] <= 0.5 < 1.05 <= ratio[plain[1]]          # one fits with room, the next does not
    assert offload[:2] == plain and 2 <= ratio[offload[2]] and 3 <= ratio[offload[3]]
    assert nvme == [offload[2]]                                      # twice the limit, on NVMe


def test_notebook_16_refuses_a_limit_its_sizes_cannot_span():
    from course_utils.kernel.views import bigger

    with pytest.raises(ValueError, match="choose a limit between"):
        bigger.sizes_for(40, False)


def test_the_sizes_are_named_by_their_parameters():
    from course_utils.common.records.bigger import SIZES
    from course_utils.kernel.views import bigger

    for name in SIZES:
        value, unit = name.split()
        assert abs(bigger.parameters(name) / (float(value) * {"M": 1e6, "B": 1e9}[unit]) - 1) < 0.1, name


def test_a_gpu_rank_of_16_reads_the_peak_the_capped_allocator_counts(monkeypatch):
    """The fraction caps what the caching allocator reserves; a size can fail on fragmentation with fewer bytes
    allocated. The peak notebook 16 reads on a GPU is the reserved one."""
    from course_utils.common.records.bigger import Limit
    from course_utils.rank import bigger, engine

    monkeypatch.setattr(engine, "accelerator_bytes", lambda: {"allocated": 1, "peak": 2, "reserved_peak": 3})
    assert bigger.limit_peak(Limit("cuda", 10, "cuda"), None) == 3


def test_the_readme_s_table_of_sized_models_is_the_rule_s():
    """README.md's "Your own GPU" table, row by row, against what the rule and notebook 16's choice give."""
    from course_utils.kernel.views import bigger

    names = {"RTX 4090": RTX4090, "A100": A100_40, "H100": H100, "H200": H200}
    text = (paths.ROOT / "README.md").read_text().split("### Your own GPU", 1)[1].split("\n\n**A GPU machine", 1)[0]
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and " GB)" in line.split(" | ")[0]]
    assert len(rows) == len(names)
    for gpu, gpt2, t5, sixteen in rows:
        hw = hardware.describe(1, names[gpu.strip("| ").split(" (")[0]])
        size = hardware.model_size(hw)
        assert gpt2 == f"{size}, {models.GPU_SIZES[size].params / 1e6:.0f} M" and t5 == hardware.model_size(hw, "t5")
        cap = bigger.default_cap_mb(hw)
        plain, offload, nvme = bigger.sizes_for(cap, True)
        assert sixteen.strip(" |") == (f"{cap / 1024:.1f} GiB; {', '.join(plain)} / up to {offload[-1]} / {nvme[0]}")
