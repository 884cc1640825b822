"""GPU figures (`make test-gpu` on a machine with an NVIDIA GPU; skipped without one): torch.cuda's own memory
counts beside the course's tensor accounting (03: on one GPU its one-device runs of stages 0–3; 04; 11's
activations, on one GPU from a launch of their own), the fp16 engine's own loss scaling (06) and offload where it moves bytes off the GPU (04). Each notebook runs once per test session (``run_notebook`` keeps its
figures), so on a GPU machine `make test` does not execute these notebooks a second time on the same worker."""
import pytest
import torch

from conftest import run_notebook

pytestmark = [pytest.mark.gpu, pytest.mark.notebook,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: make test-gpu on a GPU machine")]


def test_03_cuda_allocated_holds_the_model_states_the_walk_found():
    m = run_notebook("03_zero_stages")
    rows = [r for r in m["zero_memory"] if r["world_size"] <= torch.cuda.device_count()]   # the others ran on CPU ranks
    if torch.cuda.device_count() < 2:        # one GPU: the 2- and 4-rank launches ran on CPU ranks; the one-device runs
        one = {(r["stage"], r["offload"]): r for r in m["one_device_memory"]}     # measured every stage on the GPU
        assert sorted(one) == [(0, ""), (1, ""), (2, ""), (2, "optimizer"), (3, ""), (3, "optimizer+params")]
        assert one[2, "optimizer"]["accelerator_bytes"] < one[2, ""]["accelerator_bytes"]
        assert one[3, "optimizer+params"]["accelerator_bytes"] < one[3, ""]["accelerator_bytes"]
        rows = [r for r in one.values() if not r["offload"]]
    assert rows
    for r in rows:      # allocated at the measuring point: the model states, plus activations and buffers
        assert r["accelerator_peak"] >= r["accelerator_bytes"] >= r["measured_bytes"] > 0, r


def test_04_offload_takes_states_off_the_gpu():
    m = run_notebook("04_offload_and_infinity")
    assert m["is_gpu"] is True
    ladder = {r["name"]: r for r in m["ladder"]}     # (where each state lies: test_nb_04's GPU branch)
    assert ladder["stage 3 + offload"]["accelerator_peak"] < ladder["stage 3"]["accelerator_peak"]
    assert ladder["stage 2 + offload"]["step_seconds"] > ladder["stage 2"]["step_seconds"], "Adam on the host costs time"


def test_06_the_fp16_engine_scales_the_loss_itself():
    m = run_notebook("06_mixed_precision")
    assert m["loss_scaling_path"] == "fp16 engine"
    assert m["fp16_engine_error"] is None
    assert m["skipped_by_run"]["dynamic"] > 0, "dynamic loss scaling starts high and skips steps until it fits"


def test_11_activation_bytes_are_cuda_bytes_and_checkpointing_keeps_fewer():
    # (with one GPU the 2-rank launch runs on CPU ranks and the activations get a launch of their own on the GPU)
    peaks = run_notebook("11_performance_and_debugging")["activation_peak_bytes"]
    assert peaks["off"] and all(peaks["off"][k] > peaks["hf"][k] > 0 for k in peaks["hf"])
