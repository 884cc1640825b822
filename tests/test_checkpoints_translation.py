"""Fast unit tests of the checkpoint data stream and tools, the comparisons, and the translation task (no launches)."""
import random

import pytest
import torch

from course_utils.kernel import checkpoints as ck
from course_utils.kernel.compare import max_abs_series_diff, max_abs_state_diff
from course_utils.rank import data
from course_utils.rank import translation as tr
from course_utils.rank.models import tiny_gpt2


def test_global_batch_is_the_same_for_any_number_of_ranks():
    batch = data.global_batch(3, 8)
    assert torch.equal(batch, data.global_batch(3, 8)), "data must be deterministic for resume checks"
    assert torch.equal(torch.cat([data.rank_slice(batch, r, 2) for r in range(2)]), batch)
    assert torch.equal(data.rank_slice(batch, 0, 1), batch)
    assert not torch.equal(data.global_batch(4, 8), batch)
    with pytest.raises(ValueError, match="multiple of the number of ranks"):
        data.rank_slice(batch, 0, 3)


def test_file_roles_name_every_checkpoint_file():
    assert "tag" in ck.file_role("latest")
    assert "rank 1" in ck.file_role("zero_pp_rank_1_mp_rank_00_optim_states.pt")
    assert "ZeRO-3" in ck.file_role("zero_pp_rank_0_mp_rank_00_model_states.pt")
    assert "weights" in ck.file_role("mp_rank_00_model_states.pt")
    assert "not a DeepSpeed" in ck.file_role("notes.txt")
    assert "rank 1" in ck.file_role("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"), "bf16 names the optimizer files so"


def test_tree_draws_the_folder_with_its_sizes(tmp_path):
    (tmp_path / "ckpt" / "global_step2").mkdir(parents=True)
    (tmp_path / "ckpt" / "global_step2" / "b.pt").write_bytes(b"x" * 2048)
    (tmp_path / "ckpt" / "global_step2" / "a.pt").write_bytes(b"x" * 10)
    (tmp_path / "ckpt" / "latest").write_text("global_step2")
    lines = ck.tree(tmp_path / "ckpt", "stage 2").splitlines()
    assert lines[0] == "stage 2/  (2.0 KiB)"                       # 2048 + 10 + 12 bytes
    assert [line.split()[-2:] for line in lines[1:]] == [["2.0", "KiB"], ["10", "B"], ["2.0", "KiB"], ["12", "B"]]
    assert lines[1].startswith("├── global_step2/") and lines[2].startswith("│   ├── a.pt")
    assert lines[3].startswith("│   └── b.pt") and lines[4].startswith("└── latest")
    with pytest.raises(FileNotFoundError, match="run the launch"):
        ck.tree(tmp_path / "missing")
    both = ck.side_by_side("a\nbb", "c", gap=2).splitlines()
    assert both == ["a   c", "bb"]
    assert ck.human_bytes(5 * 2**20) == "5.0 MiB"


def test_show_source_quotes_installed_lines(capsys):
    ck.show_source("deepspeed", "runtime/engine.py", "def _get_zero_ckpt_prefix", after=1)
    out = capsys.readouterr().out
    assert "\ndeepspeed/runtime/engine.py:" in "\n" + out and "bf16_" in out
    with pytest.raises(LookupError, match="differs"):
        ck.show_source("deepspeed", "runtime/engine.py", "no such line anywhere")


def test_state_and_series_diffs():
    a = {"w": torch.zeros(3), "b": torch.ones(2)}
    b = {"w": torch.tensor([0.0, 0.5, 0.0]), "b": torch.ones(2)}
    assert max_abs_state_diff(a, b) == 0.5
    with pytest.raises(KeyError):
        max_abs_state_diff(a, {"w": torch.zeros(3)})
    assert max_abs_series_diff([1.0, 2.0], [1.0, 2.25]) == 0.25
    with pytest.raises(ValueError):
        max_abs_series_diff([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        max_abs_series_diff([], [])


def test_weights_only_accepts_tensors_and_refuses_objects(tmp_path):
    torch.save({"w": torch.ones(2), "step": 3}, tmp_path / "ok.pt")
    torch.save({"obj": random.Random(0)}, tmp_path / "bad.pt")
    assert ck.try_weights_only(tmp_path / "ok.pt") == "ok"
    assert ck.try_weights_only(tmp_path / "bad.pt").startswith("refused")


def test_tiny_gpt2_is_seeded():
    a, b = tiny_gpt2("checkpoints", seed=0), tiny_gpt2("checkpoints", seed=0)
    assert max_abs_state_diff(a.state_dict(), b.state_dict()) == 0.0


def test_converters_ship_with_deepspeed():
    assert ck.find_script("checkpoint/ds_to_universal.py").is_file()
    assert ck.find_script("utils/zero_to_fp32.py").is_file()
    with pytest.raises(FileNotFoundError):
        ck.find_script("checkpoint/no_such_tool.py")


def test_synthetic_language_reorders_and_agrees():
    lex = tr.Lexicon.build(0)
    sizes = lex.vocabulary_sizes()
    assert 40 <= sizes["source_words"] <= 1000
    rng = random.Random(0)
    for _ in range(50):
        src, tgt = lex.sentence_pair(rng)
        s, t = src.split(), tgt.split()
        verb = next(w for w in s if w in lex.verbs)
        assert lex.verbs[verb] in (t[-1], t[-2]), "the verb moves to the end (before an optional adverb)"
        noun = next(w for w in s if w in lex.nouns)
        t_noun, gender = lex.nouns[noun]
        assert t[0] == lex.determiners[s[0]][gender], "the determiner agrees with the noun"
        assert t[1] == t_noun, "adjectives follow the noun"


def test_corpus_tokenizer_and_model(tmp_path):
    corpus = tr.synthetic_corpus(train=200, test=20, seed=1)
    assert len(corpus["train"]) == 200 and len(corpus["test"]) == 20
    train_src = {ex["src"] for ex in corpus["train"]["translation"]}
    assert not train_src & {ex["src"] for ex in corpus["test"]["translation"]}, "test sentences are unseen"
    tok = tr.train_tokenizer(corpus)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    pair = corpus["train"][0]["translation"]
    ids = tok(pair["tgt"])["input_ids"]
    assert ids[-1] == 1 and tok.decode(ids, skip_special_tokens=True) == pair["tgt"]
    model = tr.tiny_t5(tok, d_model=32, layers=1)
    assert model.config.vocab_size == len(tok) and model.config.decoder_start_token_id == 0
    out = tr.translate(model, tok, [pair["src"]], max_length=4)
    assert len(out) == 1 and isinstance(out[0], str)


def test_word_for_word_knows_the_words_but_not_the_order():
    corpus = tr.synthetic_corpus(train=500, test=20, seed=0)
    dictionary = tr.word_for_word(corpus["train"]["translation"])
    lex = tr.Lexicon.build(0)
    assert all(dictionary[s] == t for s, (t, _) in lex.nouns.items() if s in dictionary), "nouns have one translation"
    assert all(dictionary[s] == lex.verbs[s] for s in lex.verbs if s in dictionary)
    pairs = corpus["test"]["translation"]
    looked_up = tr.look_up(dictionary, [p["src"] for p in pairs])
    assert [len(t.split()) for t in looked_up] == [len(p["src"].split()) for p in pairs]
    assert tr.bleu(looked_up, [p["tgt"] for p in pairs]) < 10, "word order and agreement defeat a look-up"


def test_differences_are_marked_word_by_word():
    from course_utils.kernel.views.translation import mark_differences

    assert mark_differences("lo javi un myju", "lo javi un myju") == ("lo javi un myju", 0)
    assert mark_differences("la javi un myju", "lo javi un myju") == ("[la] javi un myju", 1)
    assert mark_differences("lo javi myju", "lo javi un myju") == ("lo javi myju", 1), "a missing word counts"


def test_bleu():
    assert tr.bleu(["lo javi un myju"], ["lo javi un myju"]) == pytest.approx(100.0)
    assert tr.bleu(["xx yy zz ww"], ["lo javi un myju"]) < 5


def test_a_script_is_quoted_from_the_file_that_runs(capsys):
    from course_utils.common import paths
    from course_utils.kernel.views.source import show_script

    show_script("02_train.py", "engine.step()", "deepspeed.initialize(")
    printed = capsys.readouterr().out.splitlines()
    lines = (paths.SCRIPTS / "02_train.py").read_text().splitlines()
    numbered = [ln for ln in printed if "|" in ln]
    assert [lines[int(ln.split("|")[0]) - 1] for ln in numbered] == [ln.split("| ", 1)[1] for ln in numbered]
    assert any("engine.step()" in ln for ln in numbered) and "        ⋮" in printed      # not adjacent: marked
    with pytest.raises(LookupError, match="02_train.py"):
        show_script("02_train.py", "engine.no_such_call(")
