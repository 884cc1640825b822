"""Config checks: DeepSpeed's own classes plus the mistakes DeepSpeed lets through silently."""
import json

import pytest

from course_utils.common import paths
from course_utils.kernel.config_doctor import world_of
from course_utils.kernel import configs
from course_utils.kernel.configs import ConfigError, diagnose, validate


def base(**extra):
    return {"train_micro_batch_size_per_gpu": 2, **extra}


def deepspeed_reads(config: dict, world_size: int = 2) -> bool:
    """Whether DeepSpeed's own DeepSpeedConfig reads the config without raising."""
    from deepspeed.runtime.config import DeepSpeedConfig
    try:
        with world_of(world_size):
            DeepSpeedConfig(json.loads(json.dumps(config)))
    except Exception:       # noqa: BLE001 - any refusal counts, whatever DeepSpeed raised
        return False
    return True


@pytest.mark.parametrize("path", sorted(paths.CONFIGS.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    validate(path, world_size=2, trainer=path.name.startswith("trainer") or "auto" in path.read_text())


@pytest.mark.parametrize("config, world_size, fragment", [
    (base(zero_optimization={"stage": 3, "stage3_max_live_params": 1e9}), 2, "stage3_max_live_parameters"),
    (base(fp16={"enabled": True, "loss_scal": 0}), 2, "fp16.loss_scal"),
    (base(zero_optimization={"stage": 3, "offload_param": {"device": "gpu"}}), 2,
     "offload_param.device: \"gpu\" is not allowed; use one of 'none', 'cpu', 'nvme'"),
    (base(zero_optimization={"stage": 4}), 2, "zero_optimization.stage: 4 is not allowed; use one of 0, 1, 2, 3"),
    (base(zero_optimization={"stage": 2, "reduce_bucket_size": "big"}), 2, "reduce_bucket_size: \"big\" is not allowed"),
    ({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, 2,
     "train_batch_size = train_micro_batch_size_per_gpu"),
    (base(optimizer={"type": "AdamWW"}), 2, "Did you mean 'AdamW'"),
    (base(scheduler={"type": "WarmUpLR"}), 2, "Did you mean 'WarmupLR'"),
    (base(fp16={"enabled": True}, bf16={"enabled": True}), 2, "cannot be simultaneously enabled"),
    (base(optimizer={"type": "AdamW", "params": {"lr": "auto"}}), 2, "filled in only by the Hugging Face Trainer"),
    # DeepSpeed's other refusals: a removed block (DeepSpeedConfigError), and whatever its code raises on a value
    (base(nebula={"enabled": True}), 2, "nebula: DeepSpeed"),
    (base(zero_optimization={"stage": 3, "mics_shard_size": 2}), 2, "zero_optimization.mics_shard_size: DeepSpeed"),
    (base(checkpoint={"tag_validation": "maybe"}), 2, "checkpoint.tag_validation: DeepSpeed refuses it"),
    (base(data_types={"keep_in_fp32_modules": 3}), 2, "data_types.keep_in_fp32_modules: DeepSpeed refuses it"),
    (base(communication_data_type="fp8"), 2, "communication_data_type: DeepSpeed refuses it (ValueError"),
    (base(optimizer="Adam"), 2, "optimizer: DeepSpeed refuses it (AttributeError"),
    (base(fp16=[True]), 2, "fp16: DeepSpeed refuses it (TypeError"),
    (base(fp16={"enabled": True, "fp16_master_weights_and_grads": True}), 2,
     "fp16.fp16_master_weights_and_grads: DeepSpeed refuses it (AssertionError"),
    (base(zero_optimization={"stage": 2, "cpu_offload": True, "offload_optimizer": {"device": "cpu"}}), 2,
     "zero_optimization.cpu_offload, zero_optimization.offload_optimizer: DeepSpeed refuses them"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_mistakes_raise_config_error_naming_the_key(config, world_size, fragment):
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=world_size)
    assert type(err.value) is ConfigError and fragment in str(err.value)
    assert err.value.__cause__ is None and "Traceback" not in str(err.value)


def test_every_problem_comes_in_one_error():
    config = base(zero_optimisation={"stage": 2}, amp={"enabled": True}, sparse_attention={"mode": "fixed"},
                  fp16={"enabled": True, "loss_scal": 0}, bf16={"enabled": "yes please"},
                  optimizer={"type": "AdamWW"}, gradient_accumulation_steps=0)
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=2)
    message = str(err.value)
    named = [line[4:].split(": ")[0] for line in message.splitlines() if line.startswith("  - ")]
    for key in ("amp", "sparse_attention", "fp16.loss_scal", "bf16.enabled", "optimizer.type",
                "gradient_accumulation_steps"):
        assert any(key in keys.split(", ") for keys in named), f"{key} missing from:\n{message}"
    assert len(named) == 6 and "6 problems" in message          # the misspelt block is a warning (below)
    assert [w for w in diagnose(config, world_size=2).warnings if "'zero_optimisation'" in w]


@pytest.mark.parametrize("key, value, near", [("zero_optimisation", {"stage": 2}, "zero_optimization"),
                                              ("comms_config", {"verbose": False}, "comms_logger"),
                                              ("gradient_clip", 1.0, "gradient_clipping")])
def test_a_misspelt_top_level_block_is_a_loud_warning_never_an_error(key, value, near, capsys):
    """DeepSpeed runs a config whose top-level key it has no option for (it never reads it), so the pre-check lets
    it through too, but first in its warning line, naming the key it is close to."""
    config = base(cuda_visible_devices=0, **{key: value})     # the unrelated key first: the typo still leads
    assert deepspeed_reads(config)
    capsys.readouterr()
    assert validate(config, world_size=2) == config
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    assert f"Config warning (<dict>): LIKELY TYPO: DeepSpeed ignores the top-level key {key!r}" in printed
    assert f"did you mean {near!r}? Rename it" in printed and "'cuda_visible_devices'" in printed


@pytest.mark.parametrize("note", ["_comment", "comment", "comments", "_description", "description", "note", "_notes",
                                  "__doc__"])
def test_a_note_at_the_top_level_passes_without_a_word(note, capsys):
    """A note to the config's readers is no typo, however close its name is to an option ("comment" and
    ``comet``): DeepSpeed ignores it, and the pre-check says nothing."""
    config = base(**{note: "ZeRO-2 for 2 ranks", "zero_optimization": {"stage": 2}})
    assert deepspeed_reads(config)
    capsys.readouterr()
    verdict = diagnose(config, world_size=2)
    assert verdict.errors == [] and verdict.warnings == []
    assert validate(config, world_size=2) == config
    assert "Config warning" not in capsys.readouterr().out


@pytest.mark.parametrize("config, path", [
    (base(zero_optimization={"stage": 2, "_comment": "why"}), "zero_optimization._comment"),
    (base(fp16={"enabled": True, "comment": "why"}), "fp16.comment"),
    (base(zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "_note": "why"}}),
     "zero_optimization.offload_param._note"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_note_inside_a_strict_section_is_refused_as_deepspeed_refuses_it(config, path):
    """DeepSpeed's section models forbid unknown keys, notes included; the pre-check agrees and says where a note
    can go instead, with no spelling suggestion."""
    assert not deepspeed_reads(config)
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=2)
    message = str(err.value)
    assert f"{path}: DeepSpeed refuses any key this section has no option for, notes included" in message
    assert "move the note to the top level" in message and "did you mean" not in message


def test_a_note_inside_a_section_deepspeed_reads_by_key_passes():
    """The optimizer and scheduler sections are plain dicts DeepSpeed reads by key: it ignores a note there."""
    config = base(optimizer={"type": "AdamW", "_comment": "betas from the paper", "params": {"lr": 1e-3}},
                  scheduler={"type": "WarmupLR", "_comment": "short warm-up", "params": {"warmup_num_steps": 10}})
    assert deepspeed_reads(config)
    verdict = diagnose(config, world_size=2)
    assert verdict.errors == [] and verdict.warnings == []


@pytest.mark.parametrize("name, instead, reason", [
    ("OneBitAdam", "Adam", "1bit-Adam"), ("onebitadam", "Adam", "1bit-Adam"), ("ZeroOneAdam", "Adam", "0/1 Adam"),
    ("OneBitLamb", "Lamb", "1bit-Lamb")])
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_one_bit_optimizers_are_refused_with_deepspeeds_reasons(name, instead, reason, stage):
    """0.19.8 has no 1-bit optimizer (the engine's _is_supported_optimizer refuses the name); the pre-check says so,
    what to write instead and which settings to drop, and under ZeRO the reason the versions that had them refused
    them."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    config = base(optimizer={"type": name, "params": {"lr": 1e-3, "weight_decay": 0.01, "freeze_step": 400}},
                  zero_optimization={"stage": stage})
    assert deepspeed_reads(config) and not DeepSpeedEngine._is_supported_optimizer(None, name)
    with pytest.raises(ConfigError) as err:
        validate(config, world_size=2)
    message = str(err.value)
    assert f"optimizer.type: {name!r} is one of DeepSpeed's 1-bit optimizers" in message
    assert "no longer ships" in message and "is neither a DeepSpeed optimizer" not in message
    assert f"Write {instead!r} instead and remove optimizer.params.freeze_step, which" in message
    assert (f'with ZeRO stage {stage} ("{reason} is not compatible with ZeRO")' in message) == (stage > 0), message


def test_ignored_keys_are_one_warning_line_and_the_launch_goes_on(capsys):
    config = base(cuda_visible_devices=0, my_notes="tried 3 lrs",
                  zero_optimization={"stage": 2, "stage3_max_live_parameters": 1e9, "offload_param": {"device": "cpu"}})
    assert validate(config, world_size=2) == config
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    for fragment in ("'cuda_visible_devices'", "'my_notes'", "DeepSpeed ignores",
                     "stage3_max_live_parameters, offload_param only acts in ZeRO stage 3"):
        assert fragment in printed
    verdict = diagnose(base(zero_optimization={"stage": 0, "overlap_comm": True}), world_size=2)
    assert verdict.errors == [] and [w for w in verdict.warnings if "needs ZeRO" in w]


@pytest.mark.parametrize("value", [None, "x", [1], 3, {"bogus": 1}, {"enabled": "x", "type": 3}],
                         ids=lambda v: json.dumps(v))
def test_no_value_of_any_key_crashes_the_check(value):
    """Whatever a top-level key holds, the pre-check answers with a verdict (no exception) whose errors name it."""
    from course_utils.kernel.config_doctor import read
    keys = sorted(k for k in read(base(), 2).read if isinstance(k, str))
    assert len(keys) > 30
    for key in keys:
        verdict = diagnose({**base(), key: value}, world_size=2)
        named = [e.split(": ")[0] for e in verdict.errors]
        assert all(key in said for said in named), f"{key}={value!r}: {verdict.errors}"


def test_a_wrong_value_of_a_known_key_gets_no_spelling_suggestion():
    with pytest.raises(ConfigError) as err:
        validate(base(zero_optimization={"stage": 4}))
    assert "did you mean" not in str(err.value) and "or 3" not in str(err.value)


def test_batch_sizes_are_checked_with_the_launch_world_size():
    cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}
    validate(cfg, world_size=2)
    with pytest.raises(ConfigError):
        validate(cfg, world_size=4)


def test_auto_values_pass_for_the_trainer_only():
    cfg = json.loads((paths.CONFIGS / "trainer_zero2_offload.json").read_text())
    assert validate(cfg, world_size=2, trainer=True) == cfg       # returned as written, autos kept
    with pytest.raises(ConfigError, match="auto"):
        validate(cfg, world_size=2)


def test_file_errors_say_where(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "train_micro_batch_size_per_gpu": 2,\n}\n')
    with pytest.raises(ConfigError, match="line 3"):
        validate(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        validate(tmp_path / "missing.json")
    (tmp_path / "twice.json").write_text('{"fp16": {"enabled": true}, "steps_per_print": 1, "fp16": {}}')
    with pytest.raises(ConfigError, match="'fp16' appears twice"):
        validate(tmp_path / "twice.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="JSON object"):
        validate(tmp_path / "list.json")


def test_deepspeed_verdict_is_deepspeeds_own_word_for_that_many_ranks():
    config = {**configs.load("02_emotion.json")[0], "train_batch_size": 256, "gradient_accumulation_steps": 4}
    parsed, said = configs.deepspeed_verdict(config, 2)
    assert said == "" and parsed.train_micro_batch_size_per_gpu == 32
    parsed, said = configs.deepspeed_verdict(config, 8)
    assert parsed is None and said.startswith("AssertionError") and "256 != 32 * 4 * 8" in said
    assert "derives" not in said, "DeepSpeed's words only, no course hint"
