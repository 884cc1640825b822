"""Config checks: DeepSpeed's own classes plus the mistakes DeepSpeed lets through silently."""
import json

import pytest

from course_utils.common import paths
from course_utils.kernel.configs import ConfigError, diagnose, validate


def base(**extra):
    return {"train_micro_batch_size_per_gpu": 2, **extra}


@pytest.mark.parametrize("path", sorted(paths.CONFIGS.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    validate(path, world_size=2, trainer=path.name.startswith("trainer") or "auto" in path.read_text())


@pytest.mark.parametrize("config, world_size, fragment", [
    (base(zero_optimisation={"stage": 2}), 2, "did you mean 'zero_optimization'"),
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
    for key in ("zero_optimisation", "amp", "sparse_attention", "fp16.loss_scal", "bf16.enabled", "optimizer.type",
                "gradient_accumulation_steps"):
        assert any(key in keys.split(", ") for keys in named), f"{key} missing from:\n{message}"
    assert len(named) == 7 and "7 problems" in message


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
