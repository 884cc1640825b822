"""Unit tests of course_utils.rank.data, .models and .distributed, and of notebook 01's views
(no launches: they run in a second or two)."""
import random

import pytest
import torch
import torch.distributed as dist

from course_utils.common.records.collectives import COLLECTIVES, AllReduceTime
from course_utils.rank import data, distributed, models, ring
from course_utils.kernel.views import distributed as distributed_views


@pytest.fixture(scope="module")
def splits():
    return data.emotion_dataset(300, 51, seed=0)


def test_emotion_examples_are_reproducible_and_labelled():
    a = [data.emotion_example(random.Random(1)) for _ in range(3)]
    b = [data.emotion_example(random.Random(1)) for _ in range(3)]
    assert a == b
    rng = random.Random(0)
    rows = [data.emotion_example(rng) for _ in range(600)]
    assert {label for _, label in rows} == set(range(len(data.EMOTION_LABELS)))
    assert any(" not " in text or "don't" in text for text, _ in rows), "some sentences deny another emotion"


def test_emotion_dataset_is_cached_with_indices(splits):
    assert (len(splits["train"]), len(splits["eval"])) == (300, 51)
    assert splits["eval"]["idx"] == list(range(51))
    assert splits["train"].features["label"].names == data.EMOTION_LABELS
    again = data.emotion_dataset(300, 51, seed=0)
    assert again["train"]["text"] == splits["train"]["text"]


def test_train_wordpiece_adds_bert_special_tokens(splits):
    tok = data.train_wordpiece(splits["train"]["text"], vocab_size=200)
    ids = tok("i am not furious")["input_ids"]
    assert tok.convert_ids_to_tokens([ids[0], ids[-1]]) == ["[CLS]", "[SEP]"]
    assert tok.pad_token_id == 0 and len(tok) <= 200
    assert tok.convert_ids_to_tokens(tok("zzqx")["input_ids"])[1] in ("[UNK]", "z")


def test_the_tokenizer_is_the_same_in_every_process():
    """tokenizers' WordPiece trainer numbers its pieces in a hash map's order (huggingface/tokenizers#1794); the course's
    fixed order gives two processes, as two fresh build folders, the same vocabulary (notebook 02 trains it so)."""
    import subprocess
    import sys

    code = ("import json; from course_utils.rank import data; s = data.emotion_dataset(300, 51, seed=0); "
            "print(json.dumps(data.train_wordpiece(s['train']['text'], 1000).get_vocab(), sort_keys=True))")
    both = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=120) for p in both]
    finally:
        for p in both:
            p.kill()
    assert all(p.returncode == 0 for p in both), [err[-500:] for _, err in outputs]
    vocabularies = [out.splitlines()[-1] for out, _ in outputs]
    assert vocabularies[0] == vocabularies[1]


def test_tokenize_gives_fixed_length_tensors(splits):
    tok = data.train_wordpiece(splits["train"]["text"], vocab_size=200)
    encoded = data.tokenize(splits["eval"], tok, max_length=16)
    row = encoded[0]
    assert row["input_ids"].shape == (16,) and row["attention_mask"].dtype == torch.long
    assert set(encoded.format["columns"]) == {"idx", "input_ids", "attention_mask", "label"}


def test_tiny_bert_classifier_is_seeded_and_named():
    a = models.tiny_bert_classifier(100, 6, labels=data.EMOTION_LABELS, seed=3)
    b = models.tiny_bert_classifier(100, 6, labels=data.EMOTION_LABELS, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert a.config.id2label[5] == "happiness" and a.config.num_labels == 6
    out = a(input_ids=torch.randint(0, 100, (2, 8)), labels=torch.tensor([0, 5]))
    assert out.logits.shape == (2, 6) and out.loss.item() > 0
    assert models.count_parameters(a) > 10_000
    with pytest.raises(ValueError):
        models.tiny_bert_classifier(100, 3, labels=["a", "b"])


def test_ring_bytes_expected():
    assert ring.ring_bytes_expected(1000, 4) == 1500
    assert ring.ring_bytes_expected(1000, 2) == 1000
    assert ring.ring_bytes_expected(1000, 1) == 0


def test_count_sent_bytes_wraps_and_restores():
    original = dist.send
    with ring.count_sent_bytes() as counter:
        assert dist.send is not original
        with pytest.raises(Exception):      # no process group here: the call fails, but it was counted
            dist.send(torch.zeros(10), 1)
    assert dist.send is original
    assert counter == {"bytes": 40, "messages": 1}


def test_collectives_table_orders_rows():
    records = [{"name": "collectives", "rank": r, "value": [{"collective": c, "rank": r, "before": [r], "after": [r], "how": ""}
                                                         for c in reversed(COLLECTIVES)]}
               for r in (1, 0)]
    table = distributed_views.collectives_table(records)
    assert list(table.index.get_level_values(0).unique()) == list(COLLECTIVES)
    assert list(table.loc["broadcast"].index) == [0, 1]


def test_figures_draw():
    import matplotlib
    matplotlib.use("Agg")
    assert len(distributed_views.plot_parallelism_families().axes) == 4
    rows = [AllReduceTime(n, 4 * n, 1e-4 * n ** 0.5, 1.0) for n in (10, 1000)]
    assert len(distributed_views.plot_all_reduce_times(rows, 2, "gloo").axes) == 2


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo process group of one rank, for the rank-side helpers."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_run_collectives_on_one_rank(one_rank_group):
    rows = {r.collective: r for r in distributed.run_collectives("cpu")}
    assert list(rows) == list(COLLECTIVES)
    assert rows["all_reduce"].after == [1.0] and rows["all_gather"].after == [1.0]
    assert "ok" in rows["reduce_scatter"].how or "all_reduce + slice" in rows["reduce_scatter"].how


@pytest.mark.parametrize("preset, sizes, params", [
    ("zero_lab", (8192, 128, 384, 6, 6, 0.0, 8191), 13_842_432),
    ("checkpoints", (64, 16, 64, 2, 2, 0.0, 0), 105_216),
    ("trainer", (64, 16, 32, 2, 2, 0.1, 63), 28_032),         # GPT-2's default dropout; its special tokens inside the vocabulary
])
def test_gpt2_presets_keep_their_sizes_and_seeded_weights(preset, sizes, params):
    a, b = models.tiny_gpt2(preset, seed=0), models.tiny_gpt2(preset, seed=0)
    c = a.config
    assert (c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head, c.resid_pdrop, c.eos_token_id) == sizes
    assert models.count_parameters(a) == params
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert models.PRESETS[preset].seq_len <= c.n_positions
    with pytest.raises(KeyError, match="zero_lab"):
        models.tiny_gpt2("no_such_preset")


def test_data_streams_follow_their_presets():
    p = models.PRESETS["checkpoints"]
    assert data.global_batch(0, 4).shape == (4, p.seq_len) and int(data.global_batch(0, 4).max()) < p.vocab_size
    rows = data.counting_dataset(rows=3)
    assert rows[0]["input_ids"].shape == (models.PRESETS["trainer"].seq_len,)


def test_classification_report_counts_like_the_usual_table():
    """Notebook 02's report: per-class precision, recall, F1 and support, accuracy and the two averages."""
    import torch

    from course_utils.rank.data import classification_report

    labels, preds = torch.tensor([0, 0, 1, 1, 1, 2]), torch.tensor([0, 1, 1, 1, 0, 1])
    lines = classification_report(labels, preds, ["a", "b", "c"]).splitlines()
    rows = {l.split()[0]: l.split()[1:] for l in lines[2:5]}
    assert rows["a"] == ["0.500", "0.500", "0.500", "2"]
    assert rows["b"] == ["0.500", "0.667", "0.571", "3"]
    assert rows["c"] == ["0.000", "0.000", "0.000", "1"]          # never predicted: 0, not an error
    assert lines[6].split() == ["accuracy", "0.500", "6"]
    assert lines[7].split()[-1] == "6" and lines[7].split()[2] == "0.333"         # macro precision (0.5 + 0.5 + 0) / 3
