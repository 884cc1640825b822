"""Unit tests of course_utils.data, course_utils.models and the in-notebook parts of course_utils.distributed
(no launches: they run in a second or two)."""
import random

import pytest
import torch
import torch.distributed as dist

from course_utils import data, distributed, models


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


def test_tokenize_gives_fixed_length_tensors(splits):
    tok = data.train_wordpiece(splits["train"]["text"], vocab_size=200)
    encoded = data.tokenize(splits["eval"], tok, max_length=16)
    row = encoded[0]
    assert row["input_ids"].shape == (16,) and row["attention_mask"].dtype == torch.long
    assert set(encoded.format["columns"]) == {"idx", "input_ids", "attention_mask", "label"}


def test_shard_loader_pads_and_covers():
    shards = [[i for b in data.shard_loader(list(range(7)), 2, r, 3) for i in b.tolist()] for r in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3]
    assert set(sum(shards, [])) == set(range(7))


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
    assert distributed.ring_bytes_expected(1000, 4) == 1500
    assert distributed.ring_bytes_expected(1000, 2) == 1000
    assert distributed.ring_bytes_expected(1000, 1) == 0


def test_count_sent_bytes_wraps_and_restores():
    original = dist.send
    with distributed.count_sent_bytes() as counter:
        assert dist.send is not original
        with pytest.raises(Exception):      # no process group here: the call fails, but it was counted
            dist.send(torch.zeros(10), 1)
    assert dist.send is original
    assert counter == {"bytes": 40, "messages": 1}


def test_collectives_table_orders_rows():
    rows = [{"collective": c, "rank": r, "before": [r], "after": [r], "how": ""}
            for c in reversed(distributed.COLLECTIVES) for r in (1, 0)]
    table = distributed.collectives_table(rows)
    assert list(table.index.get_level_values(0).unique()) == list(distributed.COLLECTIVES)
    assert list(table.loc["broadcast"].index) == [0, 1]


def test_figures_draw():
    import matplotlib
    matplotlib.use("Agg")
    assert len(distributed.plot_parallelism_families().axes) == 4
    rows = [{"elements": n, "bytes": 4 * n, "seconds": 1e-4 * n ** 0.5, "gbytes_per_s": 1.0} for n in (10, 1000)]
    assert len(distributed.plot_all_reduce_times(rows, 2, "gloo").axes) == 2


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo process group of one rank, for the rank-side helpers."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_gather_predictions_keeps_each_index_once(one_rank_group):
    idx, preds, labels = distributed.gather_predictions(torch.tensor([3, 1, 2, 3]), torch.tensor([0, 1, 2, 0]),
                                                        torch.tensor([5, 4, 3, 5]))
    assert idx.tolist() == [1, 2, 3] and preds.tolist() == [1, 2, 0] and labels.tolist() == [4, 3, 5]


def test_run_collectives_on_one_rank(one_rank_group):
    rows = {r["collective"]: r for r in distributed.run_collectives("cpu")}
    assert list(rows) == list(distributed.COLLECTIVES)
    assert rows["all_reduce"]["after"] == [1.0] and rows["all_gather"]["after"] == [1.0]
    assert "ok" in rows["reduce_scatter"]["how"] or "all_reduce + slice" in rows["reduce_scatter"]["how"]
