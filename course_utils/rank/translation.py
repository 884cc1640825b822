"""The capstone's translation task, offline: a synthetic language pair, a local tokenizer, a tiny T5, BLEU.

A classic DeepSpeed lab fine-tunes t5-small on WMT16 ro-en, which needs a model hub and a data hub. This module
builds a stand-in with the same shape that a tiny T5 can learn in minutes on a CPU:

- a *source* language with a grammar (``DET ADJ* NOUN VERB DET ADJ* NOUN ADV?``) and a few dozen
  invented words, and a *target* language that translates word by word but **reorders** (adjectives
  after the noun, the verb after the object) and makes determiners and adjectives **agree** with the
  noun's gender, so a model must attend across the sentence, not just look words up;
- a word-level tokenizer trained locally with ``tokenizers`` and wrapped as a transformers
  ``PreTrainedTokenizerFast`` (T5's special tokens: pad 0, eos 1, unk 2);
- ``tiny_t5`` from a ``T5Config``; ``bleu`` with sacrebleu; ``translate`` without DeepSpeed;
- ``word_for_word``: the baseline a model must beat, a dictionary read off the training pairs alone and applied
  word by word (it knows every word, but neither the order nor the agreement).

Every target sentence follows from its source by the rules, so a perfect translator scores BLEU 100.
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from course_utils.common import paths
from course_utils.common.records.translation import SOURCE_LANG, TARGET_LANG

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
    adjective_counts = (0, 0, 1, 1, 2)    # adjectives in a noun phrase, drawn uniformly from these

    @classmethod
    def build(cls, seed: int = 0, nouns: int = 20, adjectives: int = 8, verbs: int = 10, adverbs: int = 5) -> "Lexicon":
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
            adjs = rng.sample(list(self.adjectives), rng.choice(self.adjective_counts))
            t_noun, gender = self.nouns[noun]
            src_phrase = [det, *adjs, noun]
            tgt_phrase = [self.determiners[det][gender], t_noun, *(self.adjectives[a] + ("o" if gender == "m" else "a") for a in adjs)]
            src += src_phrase
            tgt += tgt_phrase
            if role == "subject":
                verb = rng.choice(list(self.verbs))
                src.append(verb)
        tgt.append(self.verbs[verb])                                  # the verb follows the object
        if rng.random() < 0.4:
            adv = rng.choice(list(self.adverbs))
            src.append(adv)
            tgt.append(self.adverbs[adv])
        return " ".join(src), " ".join(tgt)

    def vocabulary_sizes(self) -> dict[str, int]:
        source = len(self.nouns) + len(self.adjectives) + len(self.verbs) + len(self.adverbs) + len(self.determiners)
        target = len(self.nouns) + 2 * len(self.adjectives) + len(self.verbs) + len(self.adverbs) + 4
        return {"source_words": source, "target_words": target}


def synthetic_corpus(train: int = 8000, test: int = 200, seed: int = 0, **sizes):
    """A ``datasets.DatasetDict`` (train / test) in the WMT layout: ``{"translation": {"src": ..., "tgt": ...}}``.

    Test sentences never occur in the training split.
    """
    from datasets import Dataset, DatasetDict

    lexicon = Lexicon.build(seed, **sizes)
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
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                                             show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def prepare(train: int = 6000, test: int = 200, seed: int = 0, folder: Path | None = None) -> Path:
    """Build (or reuse) the corpus and tokenizer under ``folder``: ``corpus/`` and ``tokenizer/``.

    Done once in the notebook, before any launch, so the ranks only read them (no two ranks write).
    """
    from datasets import load_from_disk

    language = hashlib.sha1(repr((Lexicon.build(seed), Lexicon.adjective_counts)).encode()).hexdigest()[:8]
    # a changed language gets a new folder
    folder = Path(folder or paths.data_dir() / f"translation_{train}_{test}_{seed}_{language}")
    if not (folder / "tokenizer" / "tokenizer.json").exists():
        corpus = synthetic_corpus(train, test, seed)
        corpus.save_to_disk(str(folder / "corpus"))
        train_tokenizer(corpus).save_pretrained(str(folder / "tokenizer"))
    load_from_disk(str(folder / "corpus"))          # fail here, not in the ranks, if the cache is broken
    return folder


@dataclass(frozen=True)
class T5Shape:
    """A published T5's shape (heads of 64 dimensions), built from a config with the local tokenizer."""
    d_model: int
    layers: int
    heads: int
    d_ff: int

    @property
    def params(self) -> int:
        """Its parameters with T5's own vocabulary (32,128; the local one is smaller, so the model built here has
        fewer): the shared embedding, per encoder block self-attention (4·d·inner), the feed-forward (2·d·d_ff) and two
        layer norms, per decoder block self- and cross-attention, the feed-forward and three, each stack's relative
        position bias (32 buckets × heads) and final layer norm."""
        d, inner = self.d_model, 64 * self.heads
        encoder = self.layers * (4 * d * inner + 2 * d * self.d_ff + 2 * d)
        decoder = self.layers * (8 * d * inner + 2 * d * self.d_ff + 3 * d)
        return 32128 * d + encoder + decoder + 2 * (32 * self.heads + d)


# What a GPU trains in place of the tiny T5 (``course_utils.kernel.hardware.model_size(hw, "t5")`` picks one)
T5_SIZES = {"t5-small": T5Shape(512, 6, 8, 2048), "t5-base": T5Shape(768, 12, 12, 3072),
            "t5-large": T5Shape(1024, 24, 16, 4096)}


def tiny_t5(tokenizer, seed: int = 0, d_model: int = 128, layers: int = 2, heads: int = 16, d_ff: int | None = None,
            size: str | None = None):
    """A small T5 (encoder-decoder) from a config, sized for the synthetic task; same weights for a seed. ``size`` (or,
    in a launch sized for a GPU, ``COURSE_MODEL_SIZE``), one of :data:`T5_SIZES`: that shape instead.

    Many narrow heads: T5 knows positions only through a learned bias per head and relative distance, and finding
    which noun phrase is the subject (before the verb) and which the object takes several such distance patterns;
    with 16 heads of 8 dimensions the tiny model learns the order far sooner than with 4 heads of 32."""
    import os

    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from course_utils.rank.models import SIZE_ENV

    size = size or os.environ.get(SIZE_ENV)
    if size:
        if size not in T5_SIZES:
            raise KeyError(f"No T5 size {size!r}; the course has {sorted(T5_SIZES)}")
        shape = T5_SIZES[size]
        d_model, layers, heads, d_ff = shape.d_model, shape.layers, shape.heads, shape.d_ff
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_kv=d_model // heads, d_ff=d_ff or 2 * d_model,
                      num_layers=layers, num_decoder_layers=layers, num_heads=heads, dropout_rate=0.0,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    return T5ForConditionalGeneration(config)


def bleu(predictions: list[str], references: list[str]) -> float:
    """Corpus BLEU (sacrebleu, default 13a tokenization), 0-100."""
    import sacrebleu

    return sacrebleu.corpus_bleu(predictions, [references]).score


def word_for_word(pairs: list[dict]) -> dict[str, str]:
    """A dictionary read off parallel sentences alone (``[{"src": ..., "tgt": ...}, ...]``): each source word → the
    target word that occurs most consistently in the same sentences (Dice coefficient 2·both / (source + target))."""
    source, target, both = Counter(), Counter(), Counter()
    for pair in pairs:
        s, t = set(pair[SOURCE_LANG].split()), set(pair[TARGET_LANG].split())
        source.update(s)
        target.update(t)
        both.update((a, b) for a in s for b in t)
    best: dict[str, tuple[float, str]] = {}
    for (a, b), n in sorted(both.items()):
        score = 2 * n / (source[a] + target[b])
        if score > best.get(a, (0.0, ""))[0]:
            best[a] = (score, b)
    return {a: b for a, (_, b) in best.items()}


def look_up(dictionary: dict[str, str], sentences: list[str]) -> list[str]:
    """Word-for-word translations: every word replaced by its dictionary entry, in the source's order."""
    return [" ".join(dictionary.get(w, w) for w in s.split()) for s in sentences]


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
