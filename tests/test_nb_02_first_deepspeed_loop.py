"""Notebook 02 executed with papermill: DeepSpeed's own batch-size assertion met and fixed, the tutorial loop's sampler bug measured, the fixed loop learning well above
chance and finding every label, each evaluation example counted once, and the checkpoint reproducing the accuracy; and,
without a launch, the pieces of exercise 4's check (the loss the script measures in the ranks, the slips the check names)
and the one-line summary of several checks."""
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
    assert min(m["eval_recall"].values()) >= 0.5, f"every label is found, got the recalls {m['eval_recall']}"
    assert m["initial_logit_gain"] >= 5, "untrained, the width-scaled weights make the output depend on the sentence"
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
    assert m["rank_loss_spread"] > 0.01, "the ranks' own batch losses differ, so a rank returning its own loss fails exercise 4"


def test_exercise_4_check_names_the_usual_slips_and_passes_the_mean():
    import pandas as pd

    from course_utils.kernel.views.first_loop import misreported

    own = pd.DataFrame({0: [1.0, 0.8, 0.5], 1: [1.2, 0.6, 0.7]}, index=[1, 2, 3])    # step × rank
    mean = own.mean(axis=1)
    assert misreported(own, pd.DataFrame({0: mean, 1: mean})) == ""
    assert "its own batch" in misreported(own, own)
    assert "the sum over the ranks" in misreported(own, pd.DataFrame({0: 2 * mean, 1: 2 * mean}))
    off = misreported(own, pd.DataFrame({0: mean, 1: mean.where(mean.index != 2, 0.0)}))
    assert off.startswith("at 1 of 3 steps") and "own batch" not in off and "sum" not in off


def test_the_script_measures_the_loss_the_model_trained_on():
    import torch
    from script_modules import load_script

    from course_utils.rank.models import tiny_bert_classifier

    s = load_script("02_train")
    model = tiny_bert_classifier(50, 6, seed=0)
    batch = {"input_ids": torch.randint(0, 50, (4, 8)), "attention_mask": torch.ones(4, 8, dtype=torch.long),
             "label": torch.tensor([0, 5, 2, 2])}
    with s.watching_logits(model) as seen:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["label"])
        assert s.own_loss(seen, batch, "cpu") == pytest.approx(out.loss.item(), rel=1e-6)
        with pytest.raises(RuntimeError, match="no forward"):
            s.own_loss(seen, batch, "cpu")          # each step needs its own forward
    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert seen == {}, "the hook is gone once training ends"



def test_several_checks_print_one_line_that_says_what_they_checked(capsys):
    from course_utils.kernel import checks

    with checks.together("two things"):
        checks.check(True, "hint")
        checks.check(True, "hint")
    with checks.together("one thing"):
        checks.check(True, "hint")
    checks.check(True, "hint")
    assert capsys.readouterr().out.splitlines() == ["✔ 2 checks passed: two things", "✔ check passed: one thing",
                                                     "✔ check passed"]
    with pytest.raises(checks.ExerciseCheckError, match="second"):
        with checks.together("never printed"):
            checks.check(True, "first")
            checks.check(False, "second")
    assert capsys.readouterr().out == "" and checks._groups == []
