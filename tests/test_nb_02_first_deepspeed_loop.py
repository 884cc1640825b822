"""Notebook 02 executed with papermill: DeepSpeed's own batch-size assertion met and fixed, the tutorial loop's sampler bug measured, the fixed loop learning well above
chance, each evaluation example counted once, and the checkpoint reproducing the accuracy."""
import pytest

from conftest import run_notebook

NAME = "02_first_deepspeed_loop"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    world = m["world_size"]
    assert m["eval_examples"] == m["eval_examples_expected"] == 501, "each evaluation example counted once"
    assert m["buggy_eval_examples"] == world * m["eval_examples_expected"], "the tutorial loop's report counts every example per rank"
    assert m["majority_accuracy"] < 0.35
    assert m["eval_accuracy"] >= 0.6, f"smoke training should beat the majority class clearly, got {m['eval_accuracy']}"
    assert m["last_loss"] < 0.75 * m["first_loss"]
    assert m["fresh_accuracy"] < 0.45, "a fresh engine with new random weights has learnt nothing before loading"
    # its accuracy is the share of the examples whose label it happens to predict, from the counts the ranks measured
    predicted, support = m["fresh_predicted_counts"], m["eval_label_counts"]
    assert sum(predicted) == sum(support) == m["eval_examples_expected"]
    hits_at_most = sum(min(p, s) for p, s in zip(predicted, support))
    assert m["fresh_accuracy"] * sum(support) <= hits_at_most + 1e-6
    assert m["reload_same_predictions"] is True
    assert m["reload_accuracy"] == m["eval_accuracy"]
    assert "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 64 != 32 * 4 *" \
        in m["deepspeed_refused"], "the broken config must meet DeepSpeed's own assertion (pre-check off)"
    assert m["tutorial_batch_sizes"] == {"micro": 32, "accumulation": 4, "global": 32 * 4 * world}, "the fixed config ran"
