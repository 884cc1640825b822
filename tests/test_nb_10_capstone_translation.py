"""Notebook 10 (capstone) executed with papermill: BLEU must rise, and the hand-off must translate the same."""
import pytest

from conftest import run_notebook
from course_utils import hardware

NAME = "10_capstone_translation"
pytestmark = pytest.mark.notebook


def test_notebook_runs_and_records_its_figures():
    m = run_notebook(NAME)
    assert m["world_size"] == hardware.detect().default_procs
    # exercise 1 (solution copy): the prediction made before the launch is what the engine and the Trainer reported
    assert m["run_prediction"] == {"train_batch_size": m["train_batch_size"], "steps": m["steps"]}
    assert m["train_batch_size"] == 32 * m["world_size"]
    # exercise 2: the learner's ZeRO-3 config built a stage-3 engine with both offloads
    assert m["zero3_engine"] == {"stage": 3, "train_batch_size": m["train_batch_size"], "optimizer": "DeepSpeedCPUAdam",
                                 "offload_param": True, "partitioned": True}
    assert m["bleu_before"] < 5, "an untrained model cannot translate"
    assert m["bleu_after_zero2"] >= m["bleu_before"] + 5, f"training must raise BLEU clearly ({m})"
    # The ZeRO-3 run is the first epoch of the same training: the same losses at the same steps, up to rounding.
    # the ZeRO-3 run stops after its first epoch (the smoke test: after zero3_stop_after_steps steps)
    assert m["zero3_steps"] == (m["zero3_stop_after_steps"] or m["steps"] // m["epochs"])
    assert len(m["zero2_zero3_loss_steps"]) >= 3
    assert m["zero2_zero3_loss_gap"] < 1e-3, m["zero2_zero3_loss_gap"]
    # The hand-off generates with the ranks' settings on the ranks' examples: every translation equal, the same BLEU.
    assert m["handoff_compared"] == m["eval_examples"] > 0, "the ranks must record every translation they scored"
    assert m["handoff_same_translations"] == m["handoff_compared"], "the handed-off model must translate as in the ranks"
    assert m["export_matches_checkpoint"] is True
    assert m["handoff_bleu"] == m["bleu_after_zero2"]
