"""The capstone's translation task, offline: a synthetic language pair, a local tokenizer, a tiny T5, BLEU.

A classic DeepSpeed lab fine-tunes t5-small on WMT16 ro-en, which needs a model hub and a data hub. This module
builds a stand-in with the same shape that a tiny T5 can learn in minutes on a CPU:

- a *source* language with a grammar (``DET ADJ* NOUN VERB DET ADJ* NOUN ADV?``) and a few hundred
  invented words, and a *target* language that translates word by word but **reorders** (adjectives
  after the noun, the verb at the end) and makes determiners and adjectives **agree** with the
  noun's gender, so a model must attend across the sentence, not just look words up;
- a word-level tokenizer trained locally with ``tokenizers`` and wrapped as a transformers
  ``PreTrainedTokenizerFast`` (T5's special tokens: pad 0, eos 1, unk 2);
- ``tiny_t5`` from a ``T5Config``; ``bleu`` with sacrebleu; ``translate`` without DeepSpeed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from .. import paths

SOURCE_LANG, TARGET_LANG = "src", "tgt"
SPECIALS = ["<pad>", "</s>", "<unk>"]          # T5's ids: pad 0 (also the decoder start), eos 1, unk 2


def _words(rng: random.Random, n: int, onsets: str, vowels: str, syllables: tuple[int, int], taken: set) -> list[str]:
    """``n`` new pronounceable invented words (consonant-vowel syllables), none in ``taken``."""
    out = []
    while len(out) < n:
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(*syllables)))
        if word not in taken:
            taken.add(word)
            out.append(word)
    return out


@dataclass(frozen=True)
class Lexicon:
    """The two vocabularies and the dictionary between them."""
    nouns: dict[str, tuple[str, str]]     # source noun → (target noun, gender "m" | "f")
    adjectives: dict[str, str]            # source adjective → target stem (+ "o" / "a" by gender)
    verbs: dict[str, str]
    adverbs: dict[str, str]
    determiners = {"the": {"m": "lo", "f": "la"}, "a": {"m": "un", "f": "una"}}

    @classmethod
    def build(cls, seed: int = 0, nouns: int = 40, adjectives: int = 16, verbs: int = 24, adverbs: int = 10) -> "Lexicon":
        rng = random.Random(seed)
        taken: set = {"the", "a", "lo", "la", "un", "una"}
        src = lambda n: _words(rng, n, "bdfgklmnprstvz", "aeiou", (2, 3), taken)   # noqa: E731
        tgt = lambda n: _words(rng, n, "chjlmnqrsvx", "aeiuy", (2, 3), taken)      # noqa: E731
        return cls(nouns={s: (t, rng.choice("mf")) for s, t in zip(src(nouns), tgt(nouns))},
                   adjectives=dict(zip(src(adjectives), tgt(adjectives))),
                   verbs=dict(zip(src(verbs), tgt(verbs))), adverbs=dict(zip(src(adverbs), tgt(adverbs))))

    def sentence_pair(self, rng: random.Random) -> tuple[str, str]:
        """One random sentence and its translation."""
        src, tgt = [], []
        for role in ("subject", "object"):
            det, noun = rng.choice(list(self.determiners)), rng.choice(list(self.nouns))
            adjs = rng.sample(list(self.adjectives), rng.choice((0, 0, 1, 1, 2)))
            t_noun, gender = self.nouns[noun]
            src_phrase = [det, *adjs, noun]
            tgt_phrase = [self.determiners[det][gender], t_noun, *(self.adjectives[a] + ("o" if gender == "m" else "a") for a in adjs)]
            src += src_phrase
            tgt += tgt_phrase
            if role == "subject":
                verb = rng.choice(list(self.verbs))
                src.append(verb)
        tgt.append(self.verbs[verb])                                  # verb moves to the end
        if rng.random() < 0.4:
            adv = rng.choice(list(self.adverbs))
            src.append(adv)
            tgt.append(self.adverbs[adv])
        return " ".join(src), " ".join(tgt)

    def vocabulary_sizes(self) -> dict[str, int]:
        source = len(self.nouns) + len(self.adjectives) + len(self.verbs) + len(self.adverbs) + len(self.determiners)
        target = len(self.nouns) + 2 * len(self.adjectives) + len(self.verbs) + len(self.adverbs) + 4
        return {"source_words": source, "target_words": target}


def synthetic_corpus(train: int = 8000, test: int = 200, seed: int = 0):
    """A ``datasets.DatasetDict`` (train / test) in the WMT layout: ``{"translation": {"src": ..., "tgt": ...}}``.

    Test sentences never occur in the training split.
    """
    from datasets import Dataset, DatasetDict

    lexicon = Lexicon.build(seed)
    rng = random.Random(seed + 1)
    seen, pairs = set(), []
    while len(pairs) < train + test:
        src, tgt = lexicon.sentence_pair(rng)
        if src not in seen:
            seen.add(src)
            pairs.append({SOURCE_LANG: src, TARGET_LANG: tgt})
    return DatasetDict(train=Dataset.from_dict({"translation": pairs[:train]}),
                       test=Dataset.from_dict({"translation": pairs[train:]}))


def train_tokenizer(corpus, vocab_size: int = 2000):
    """A word-level tokenizer trained on both languages (one shared vocabulary, as T5 has),
    appending ``</s>`` to every sequence, wrapped as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    texts = (s for pair in corpus["train"]["translation"] for s in pair.values())
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def prepare(train: int = 6000, test: int = 200, seed: int = 0, folder: Path | None = None) -> Path:
    """Build (or reuse) the corpus and tokenizer under ``folder``: ``corpus/`` and ``tokenizer/``.

    Done once in the notebook, before any launch, so the ranks only read them (no two ranks write).
    """
    from datasets import load_from_disk

    folder = Path(folder or paths.data_dir() / f"translation_{train}_{test}_{seed}")
    if not (folder / "tokenizer" / "tokenizer.json").exists():
        corpus = synthetic_corpus(train, test, seed)
        corpus.save_to_disk(str(folder / "corpus"))
        train_tokenizer(corpus).save_pretrained(str(folder / "tokenizer"))
    load_from_disk(str(folder / "corpus"))          # fail here, not in the ranks, if the cache is broken
    return folder


def tiny_t5(tokenizer, seed: int = 0, d_model: int = 128, layers: int = 2):
    """A small T5 (encoder-decoder) from a config, sized for the synthetic task; same weights for a seed."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_kv=d_model // 4, d_ff=2 * d_model,
                      num_layers=layers, num_decoder_layers=layers, num_heads=4, dropout_rate=0.0,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    return T5ForConditionalGeneration(config)


def bleu(predictions: list[str], references: list[str]) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenization), 0-100."""
    import sacrebleu

    return sacrebleu.corpus_bleu(predictions, [references]).score


def eval_batch_size(examples: int, world_size: int) -> int:
    """Examples per rank when evaluation generates exactly one batch on each rank (the remainder of an
    uneven split is left out): the hand-off can then translate the very same batches."""
    if examples < world_size:
        raise ValueError(f"{examples} evaluation examples cannot give each of {world_size} ranks one: "
                         f"evaluate on at least {world_size}.")
    return examples // world_size


def translate(model, tokenizer, sentences: list[str], prefix: str = "", batch_size: int = 64,
              max_length: int = 64) -> list[str]:
    """Greedy translations with plain transformers (no DeepSpeed): how a handed-off model is used.

    The settings are the Seq2SeqTrainer's in the ranks: ``max_length`` bounds the whole output (its
    ``generation_max_length``), one beam, inputs truncated to ``max_length`` as the script tokenizes them.
    Translate in the batches the ranks used (``batch_size``) to get their translations bit for bit.

    ``synced_gpus=False``: once a ZeRO-3 config is registered in the process (by the Trainer's arguments),
    ``generate`` would otherwise wait for every rank at each token, and a single rank would hang.
    """
    import torch

    model.eval()
    out = []
    for i in range(0, len(sentences), batch_size):
        batch = tokenizer([prefix + s for s in sentences[i:i + batch_size]], return_tensors="pt", padding=True,
                          truncation=True, max_length=max_length)
        with torch.no_grad():
            generated = model.generate(**batch, max_length=max_length, do_sample=False, num_beams=1,
                                       synced_gpus=False)
        out += [t.strip() for t in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    return out
