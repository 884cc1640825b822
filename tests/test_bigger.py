"""Notebook 16's pieces without a launch: which limit a rank takes, the fraction a GPU rank gives its allocator, how a
launch's records become fit / out of memory, DeepSpeed's estimate per configuration, and the exercises' checks."""
import pytest

from course_utils.common.records.bigger import CONFIGURATIONS, SIZES, Attempt, Trial, zero_keys
from course_utils.common.records.offload import Rung
from course_utils.kernel.views import bigger as views
from course_utils.rank import bigger

MiB = 2**20
H100 = 85_045_231_616        # torch.cuda.get_device_properties(0).total_memory of an H100 80GB HBM3


@pytest.mark.parametrize("device,cgroup,kind", [("cuda", "/sys/fs/cgroup/x/cgroup.procs", "cuda"), ("cuda", None, "cuda"),
                                                ("cpu", "/sys/fs/cgroup/x/cgroup.procs", "cgroup"), ("cpu", None, "none")])
def test_the_rank_s_device_decides_its_limit(device, cgroup, kind):
    assert bigger.limit_kind(device, cgroup) == kind


def test_a_gpu_rank_caps_its_allocator_to_the_limit():
    """What the allocator does with the fraction (``allowed_memory_maximum = fraction * total``, truncated, in
    c10/cuda/CUDACachingAllocator.cpp) gives back the limit to the byte, never a byte more, for every size 16 may set."""
    for cap in (352 * MiB, 9536 * MiB, 16808 * MiB, 2**20 + 1):
        allowed = int(bigger.cuda_fraction(cap, H100) * H100)
        assert cap - 1 <= allowed <= cap
    with pytest.raises(ValueError, match="CAP_MB"):
        bigger.cuda_fraction(H100 + 1, H100)
    with pytest.raises(ValueError):
        bigger.cuda_fraction(0, H100)


def test_the_cgroup_files_of_either_version_are_read(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir(), v1.mkdir()
    (v2 / "memory.current").write_text("4096\n")
    (v2 / "memory.peak").write_text("8192\n")
    (v1 / "memory.usage_in_bytes").write_text("1024\n")
    (v1 / "memory.max_usage_in_bytes").write_text("2048\n")
    assert bigger.charged(v2 / "cgroup.procs") == 4096 and bigger.peak(v2 / "cgroup.procs") == 8192
    assert bigger.charged(v1 / "cgroup.procs") == 1024 and bigger.peak(v1 / "cgroup.procs") == 2048
    bigger.reset_peak(v1 / "cgroup.procs")
    assert (v1 / "memory.max_usage_in_bytes").read_text() == "0"


def test_the_nvme_configuration_swaps_into_a_folder_with_the_keys_it_is_given_else_deepspeed_s_defaults():
    with pytest.raises(ValueError, match="nvme_folder"):
        zero_keys("ZeRO-3 + NVMe")
    stage, keys = zero_keys("ZeRO-3 + NVMe", "/tmp/swap", largest_param=3_000_000)
    assert stage == 3 and keys["offload_param"] == keys["offload_optimizer"] == {"device": "nvme", "nvme_path": "/tmp/swap"}

    def learners(folder, largest):
        return {"offload_optimizer": {"device": "nvme", "nvme_path": folder},
                "offload_param": {"device": "nvme", "nvme_path": folder, "buffer_size": largest}}
    _, keys = zero_keys("ZeRO-3 + NVMe", "/tmp/swap", largest_param=3_000_000, nvme=learners)
    assert keys["offload_param"]["buffer_size"] == 3_000_000 and keys["stage3_prefetch_bucket_size"] == 0
    assert zero_keys("no ZeRO") == (0, {})
    with pytest.raises(KeyError, match="configuration"):
        zero_keys("ZeRO-4")


def test_no_course_module_holds_exercise_2_s_nvme_keys():
    """The NVMe keys made for a limit are notebook 16's exercise: the modules the notebook and its rank import hold
    only DeepSpeed's defaults (the launch runs those until the learner writes theirs)."""
    from deepspeed.runtime.zero.offload_config import DeepSpeedZeroOffloadParamConfig

    from course_utils.common.records import bigger as records

    assert not hasattr(records, "nvme_keys") and not hasattr(bigger, "nvme_keys")
    _, keys = CONFIGURATIONS["ZeRO-3 + NVMe"]
    assert set(keys["offload_param"]) == set(keys["offload_optimizer"]) == {"device", "nvme_path"}
    assert DeepSpeedZeroOffloadParamConfig(device="nvme", nvme_path="/tmp").max_in_cpu == int(1e9)   # the default


def test_the_sizes_grow():
    counts = [views.parameters(s) for s in SIZES]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)


def attempt(size: str, params: int = 10_000_000) -> Attempt:
    return Attempt("no ZeRO", size, params, params // 10)


def rung_with(host_side: int) -> Rung:
    return Rung(name="x", rank=0, dtype="fp32", step_seconds=0.1, accelerator="cpu", model_state_bytes=host_side,
                device_bytes=host_side, host_bytes=0, accelerator_side_bytes=0, host_side_bytes=host_side, nvme_bytes=0,
                held=[], accelerator_peak=0, gathered_in_forward=0, persistent_numel=0, optimizer="DeepSpeedCPUAdam",
                loss=1.0)


def trial(size: str, host_side: int = 0) -> Trial:
    return Trial("no ZeRO", size, 10_000_000, 1_000_000, "fp32", [6.0, 4.0], 0.1, rung=rung_with(host_side))


SIGKILL = "Rank 0 was killed by SIGKILL (exit status -9) and left no Python traceback: ..."
CUDA_OOM = "Rank 0 failed (launch exit code 1):\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"


@pytest.mark.parametrize("error,last", [(SIGKILL, views.OUT_OF_MEMORY), (CUDA_OOM, views.OUT_OF_MEMORY),
                                        ("Rank 0 failed:\nKeyError: 'x'", views.FAILED)])
def test_the_size_a_launch_died_in_is_out_of_memory_only_when_memory_ended_it(error, last):
    got = views.statuses([attempt("11 M"), attempt("25 M")], [trial("11 M")], error)
    assert got == {"11 M": views.TRAINED, "25 M": last}
    assert views.statuses([attempt("11 M")], [trial("11 M")], None) == {"11 M": views.TRAINED}


def test_the_estimate_is_deepspeed_s_for_the_configuration_on_one_rank():
    psi, largest = 10_000_000, 1_000_000
    assert views.estimate("no ZeRO", psi, largest)["device"] == 20 * psi           # stage 2, nothing divided
    assert views.estimate("ZeRO-2 + offload_optimizer", psi, largest)["device"] == 2 * psi   # the 16-bit parameters
    z3 = views.estimate("ZeRO-3 + offload (CPU)", psi, largest)
    assert z3["device"] == 4 * largest and z3["host"] == pytest.approx(18 * psi * 1.5)
    assert views.estimate("ZeRO-3 + NVMe", psi, largest) == {"device": 4 * largest, "host": None}


SIZE = "11 M"      # the first size of the ZeRO-2 + offload_optimizer launch on a CPU, exercise 1's


def placed(accelerator_side: int, host_side: int) -> views.Outcome:
    size = SIZE
    rung = rung_with(host_side)
    rung.accelerator_side_bytes = accelerator_side
    t = Trial("ZeRO-2 + offload_optimizer", size, 10_000_000, 1_000_000, "fp32", [6.0, 4.0], 0.1, rung=rung)
    later = Trial("ZeRO-2 + offload_optimizer", "25 M", 25_000_000, 1_000_000, "fp32", [6.0, 4.0], 0.1,
                  rung=rung_with(16 * 25_000_000))
    return views.Outcome("ZeRO-2 + offload_optimizer", 352, None, [attempt(size), attempt("25 M")], [t, later],
                         statuses={size: views.TRAINED, "25 M": views.TRAINED})


def test_the_placement_check_reads_both_sides_within_a_tenth_of_the_model_states_and_never_names_them():
    psi = 10_000_000                   # the trial's parameters: model states of 160 MB, a tolerance of 16 MB a side
    outcome = placed(4 * psi, 16 * psi)
    good = {"accelerator_side_mib": 4 * psi / MiB, "host_side_mib": 16 * psi / MiB}
    assert views.placement_problem(good, outcome, SIZE) is None
    assert views.placement_problem({"accelerator_side_mib": 5.2 * psi / MiB, "host_side_mib": 15 * psi / MiB},
                                   outcome, SIZE) is None
    everything_on_the_host = views.placement_problem({"accelerator_side_mib": 0, "host_side_mib": 16 * psi / MiB}, outcome,
                                                    SIZE)
    assert "accelerator side" in everything_on_the_host and "host side" not in everything_on_the_host
    assert "less" in everything_on_the_host and "38" not in everything_on_the_host and "152" not in everything_on_the_host
    grads_stay = views.placement_problem({"accelerator_side_mib": 8 * psi / MiB, "host_side_mib": 12 * psi / MiB}, outcome,
                                         SIZE)
    assert "accelerator side" in grads_stay and "host side" in grads_stay
    assert "keys" in views.placement_problem({"host_side_mib": 1.0}, outcome, SIZE)
    nothing = views.Outcome("ZeRO-2 + offload_optimizer", 352, None, [attempt(SIZE)], [], error=SIGKILL,
                            statuses={SIZE: views.OUT_OF_MEMORY})
    assert "did not train" in views.placement_problem(good, nothing, SIZE)
    # the size asked about, not the launch's largest: a later size's placement does not answer for it
    assert views.placement_problem({"accelerator_side_mib": 4 * 25_000_000 / MiB, "host_side_mib": 16 * 25_000_000 / MiB},
                                   outcome, SIZE) is not None


def test_one_size_of_a_launch_reads_as_a_launch_of_that_size_alone():
    one = views.only(placed(4, 16), "25 M")
    assert [a.size for a in one.attempts] == [t.size for t in one.trials] == ["25 M"] and one.statuses == {"25 M": "trained"}
    assert one.largest.params == 25_000_000


def test_every_configuration_has_an_estimate_and_a_stage():
    for name in CONFIGURATIONS:
        assert views.estimate(name, 1_000_000, 100_000)["device"] > 0


def nvme_outcome(status: str, nvme_bytes: int = 0, in_memory: int = 0, error: str | None = None) -> views.Outcome:
    size = "48 M"
    placed = rung_with(in_memory)
    placed.nvme_bytes = nvme_bytes
    trials = [Trial("ZeRO-3 + NVMe", size, 10_000_000, 1_000_000, "fp32", [6.0, 4.0], 1.0, rung=placed)] \
        if status == views.TRAINED else []
    return views.Outcome("ZeRO-3 + NVMe", 352, None, [attempt(size)], trials, error=error, statuses={size: status})


def test_the_nvme_check_reads_where_the_states_went():
    psi = 10_000_000
    assert views.nvme_problem(nvme_outcome(views.TRAINED, 16 * psi, 4 * psi)) is None
    assert "limit ended" in views.nvme_problem(nvme_outcome(views.OUT_OF_MEMORY, error=SIGKILL))
    refused = views.nvme_problem(nvme_outcome(views.FAILED, error="Rank 0 failed:\nAssertionError: More elements"))
    assert "DeepSpeed stopped" in refused
    assert "swap files hold less" in views.nvme_problem(nvme_outcome(views.TRAINED, 8 * psi, 4 * psi))
    assert "more than the gradients" in views.nvme_problem(nvme_outcome(views.TRAINED, 16 * psi, 8 * psi))
