"""Real public DeepSpeed configs (tests/public_configs/, sources in SOURCES.md) through the pre-check.

What DeepSpeed accepts is decided here by DeepSpeed itself: its ``DeepSpeedConfig`` reading the file as
``deepspeed.initialize`` does (hjson), with the launch's world size, plus the engine's own optimizer check
(``DeepSpeedEngine._is_supported_optimizer``), which ``DeepSpeedConfig`` leaves to ``initialize``. A config
with "auto" values is a Trainer config: the pre-check reads it with ``trainer=True``, and DeepSpeed is shown it
as the pre-check hands it over (the "auto" keys left out, one sample per rank where the batch sizes are "auto").
The pre-check must refuse none of what DeepSpeed accepts, refuse what DeepSpeed refuses with the course's
``ConfigError`` naming the key, and never raise anything else.
"""
import json
import re
from pathlib import Path

import pytest

from course_utils.kernel import configs
from course_utils.kernel.config_doctor import world_of
from course_utils.kernel.configs import ConfigError

PUBLIC = Path(__file__).parent / "public_configs"
FILES = sorted(PUBLIC.glob("*.json"))
WORLD_SIZES = (1, 2)

# What the pre-check must name for each config DeepSpeed refuses: {file: {world size: [fragments]}}
# (None: every world size tried).
REFUSED = {
    "dse_bing_bert_progressive_layer_drop_seq128.json": {None: ["progressive_layer_drop", "Remove"]},
    "dse_bing_bert_bsz64k_lamb_seq128.json": {None: ["sparse_attention", "Remove"]},
    "dse_compression_bert_ds_config.json": {1: ["compression_training"],
                                            2: ["compression_training", "gradient_accumulation_steps",
                                                "train_batch_size"]},
    "dse_moq_test.json": {None: ["quantize_training", "train_micro_batch_size_per_gpu"]},
    "dse_vit_cifar_random_ltd.json": {2: ["train_batch_size", "world size 2"]},
    "dse_autosp_config.json": {1: ["train_batch_size"]},
    # DeepSpeed's 1-bit optimizers, gone from 0.19.8: the pre-check says so, and names DeepSpeed's own reason
    # (v0.19.5 engine.py, _configure_basic_optimizer) why even the versions that had them refuse them under ZeRO
    "dse_bingbertsquad_onebitadam_bsz96_nccl.json": {None: ["optimizer.type", "'OnebitAdam'", "no longer ships",
                                                            "Write 'Adam' instead", "freeze_step"]},
    "dse_bing_bert_01adam_seq128_nccl.json": {None: ["optimizer.type", "'ZeroOneAdam'", "no longer ships",
                                                     "Write 'Adam' instead", "var_freeze_step"]},
    "dse_bing_bert_onebitlamb_bsz64k_seq128_nccl.json": {None: ["optimizer.type", "'OneBitLamb'", "no longer ships",
                                                                "Write 'Lamb' instead", "coeff_beta"]},
    "internvl_seg_adam_zero3_fp16.json": {None: ["optimizer.type", "'ZeroOneAdam'", "no longer ships", "ZeRO stage 3",
                                                 '"0/1 Adam is not compatible with ZeRO"']},
    "msdse_megatron_zero3_infinity_config.json": {
        None: ["zero_optimization.stage3_param_persitence_threshold",
               "did you mean 'stage3_param_persistence_threshold'"]},
    # unquoted template placeholders: json refuses the file, DeepSpeed's hjson reads them as strings, then refuses the
    # removed block (the doctor's warning names json's line 34, for the Trainer and accelerate)
    "msdse_megatron_zero3_curriculum_fixed_linear.json": {None: ["curriculum_learning", "removed"]},
    "deepspeed_opsd_smoke_ds_zero0.json": {None: ["train_micro_batch_size_per_gpu", "train_batch_size"]},
    "deepspeed_sdma_ds_config_zero3_sdma.json": {None: ["zero_optimization.sdma_allgather",
                                                        "zero_optimization.sdma_allgather_max_numel"]},
}
# What the pre-check must warn about in configs DeepSpeed accepts (it ignores these keys).
WARNED = {
    "dse_imagenet_ds_config.json": ["'cuda_visible_devices'"],
    "dse_imagenet_ds_fp16_z1_config.json": ["'cuda_visible_devices'"],
    "dse_tensor_parallel_hf_ds_config.json": ["zero_optimization.gather_16bit_weights_on_model_save only acts"],
    "llamafactory_ds_z3_fp8_config.json": ["LIKELY TYPO", "'comms_config'", "did you mean 'comms_logger'"],
}
# What the pre-check must not say about a config: a note (DeepSpeed ignores it), the ZeRO reason without ZeRO,
# a spelling suggestion for a key that needs none.
NOT_SAID = {
    "llamafactory_ds_z2_autotp_config.json": ["_comment", "comet"],
    "dse_bing_bert_01adam_seq128_nccl.json": ["ZeRO stage", "bias_correction", "weight_decay"],
    "dse_bing_bert_onebitlamb_bsz64k_seq128_nccl.json": ["ZeRO stage", "max_coeff"],
}


def is_trainer_config(path: Path) -> bool:
    return '"auto"' in path.read_text()


def deepspeed_refusal(path: Path, world_size: int) -> str | None:
    """None when DeepSpeed accepts the config on ``world_size`` ranks, else what it raised."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.engine import DeepSpeedEngine

    config = configs.without_auto(json.loads(path.read_text())) if is_trainer_config(path) else str(path)
    try:
        with world_of(world_size):
            parsed = DeepSpeedConfig(config)
    except Exception as e:          # noqa: BLE001 - any refusal counts, whatever DeepSpeed raised
        return f"{type(e).__name__}: {e}"
    name = parsed.optimizer_name
    if name is not None and not DeepSpeedEngine._is_supported_optimizer(None, name):
        return f"deepspeed.initialize: {name} is not a supported DeepSpeed Optimizer"
    return None


def test_sources_name_every_file_with_repository_path_and_commit():
    rows = re.findall(r"^\| `([^`]+)` \| ([\w.-]+/[\w.-]+) \| `([^`]+)` \| `([0-9a-f]{40})` \|$",
                      (PUBLIC / "SOURCES.md").read_text(), re.MULTILINE)
    assert sorted(r[0] for r in rows) == [p.name for p in FILES]
    assert len(FILES) >= 15


def test_the_expectations_name_real_files():
    assert set(REFUSED) | set(WARNED) | set(NOT_SAID) <= {p.name for p in FILES}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_precheck_agrees_with_deepspeed(path, world_size, capsys):
    refusal = deepspeed_refusal(path, world_size)
    expected = REFUSED.get(path.name, {})
    fragments = expected.get(world_size, expected.get(None))
    assert (refusal is not None) == (fragments is not None), \
        f"DeepSpeed {'refuses' if refusal else 'accepts'} {path.name} on {world_size} ranks: {refusal}"
    try:
        verdict = configs.diagnose(path, world_size=world_size, trainer=is_trainer_config(path))
        problems = verdict.error_message() if verdict.errors else None
    except ConfigError as err:       # a file the pre-check cannot even load
        problems = str(err)
    if refusal is None:
        assert problems is None, f"DeepSpeed accepts {path.name}, the pre-check refuses it:\n{problems}"
        capsys.readouterr()              # what DeepSpeed printed while reading (its accelerator line) is not the doctor's
        configs.validate(path, world_size=world_size, trainer=is_trainer_config(path))   # no ConfigError
        printed = "".join(line for line in capsys.readouterr().out.splitlines(keepends=True)
                          if "Setting accelerator to" not in line)
        for fragment in WARNED.get(path.name, []):
            assert fragment in printed and "ignore" in printed
        assert printed.count("\n") == (1 if verdict.warnings else 0), printed   # one line, or nothing
        assert not [f for f in NOT_SAID.get(path.name, []) if f in printed], printed
        return
    assert problems is not None, f"DeepSpeed refuses {path.name} ({refusal}), the pre-check lets it through"
    missing = [f for f in fragments if f not in problems]
    assert not missing, f"the pre-check's error does not name {missing}:\n{problems}"
    assert not [f for f in NOT_SAID.get(path.name, []) if f in problems], problems
    with pytest.raises(ConfigError):
        configs.validate(path, world_size=world_size, trainer=is_trainer_config(path))
