"""Tokenizers against outside oracles: the real bert-base-uncased vocabulary must give exactly the
ids of transformers' BertTokenizer and of its pure-Python port of google-research/bert's tokenizer;
trained vocabularies keep the special ids, survive save/load and pickling."""

import itertools
import pickle

import numpy as np
import pytest
import transformers
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.tokenizer import (SPECIAL_TOKENS, SentencePieceTokenizer, WordPieceTokenizer,
                                    load_tokenizer)
from bertjax.data.tokenizer_training import train_sentencepiece, train_wordpiece
from bertjax.core.errors import UserError

HARD_CASES = [
    "Héllo, wörld! Ça va? Crème brûlée, naïve façade, Ångström, Øresund, İstanbul.",
    "Punctuation: (a) [b] {c} <d> \"e\" 'f' — g – h … i; j: k! l? m/n\\o @p #q $r %s ^t &u",
    "Operators: *v +w =x ~y |z `q` 5°C 3×4 a_b a-b a.b a,b",
    "Chinese 北京大学 and Japanese ひらがな カタカナ 漢字 mixed with Korean 한국어 text.",
    "Emoji 😀🚀👍🏽 and symbols ™ © ® ° ± × ÷ ∑ ∞ ≠ ≤ → ★ ♥ ♫",
    "Unknown words: qwxzptlkv zzyzzx 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ﬁnance ＦＵＬＬＷＩＤＴＨ",
    "A very long word: " + "pneumonoultramicroscopicsilicovolcanoconiosis" * 3 + " ends here",
    "Exactly one hundred: " + "a" * 100 + " and one hundred one: " + "b" * 101,
    "Control\x00chars\x01and\x07bells\u200b zero\u200dwidth\ufeff bom\ttab\nnewline\r\x7f del",
    "Combining: e\u0301 a\u0308 n\u0303 and precomposed é ä ñ; Greek ΑΒΓ αβγ; Cyrillic Москва.",
    "Numbers 3.14159, 1,000,000, 10^6, 2nd, 3rd, 1990s, 07:45, +1-555-0100, v2.0.1.",
    "URLs http://example.com/a?b=c&d=e and emails someone@example.org",
    "Arabic العربية Hebrew עברית Thai ภาษาไทย Devanagari हिन्दी",
    "   leading and trailing spaces   ",
    "",
    "ALL CAPS SHOUTING and MiXeD cAsE WoRdS",
]


@pytest.fixture(scope="module")
def demo_sentences():
    """A few hundred real sentences: every 50th line of the Wikipedia demo corpus."""
    with open(demo_corpus_path(), encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    assert len(lines) > 15_000
    return lines[::50]


def ids_of(tokenizer, texts):
    return [list(map(int, ids)) for ids in tokenizer.encode_batch(texts)]


@pytest.mark.parametrize("lowercase", [True, False])
def test_wordpiece_matches_transformers(bert_vocab_path, demo_sentences, lowercase):
    ours = WordPieceTokenizer.from_vocab_file(bert_vocab_path, lowercase=lowercase)
    fast = transformers.BertTokenizer(bert_vocab_path, do_lower_case=lowercase)
    legacy = BertTokenizerLegacy(bert_vocab_path, do_lower_case=lowercase)
    texts = demo_sentences + HARD_CASES
    expected = [fast.encode(t, add_special_tokens=False) for t in texts]
    assert ids_of(ours, texts) == expected
    # The pure-Python tokenizer is an independent implementation of the same rules.
    assert [legacy.encode(t, add_special_tokens=False) for t in texts] == expected
    assert len(demo_sentences) >= 300 and sum(map(len, expected)) > 10_000


def test_wordpiece_hard_cases_behave_like_bert(bert_vocab_path):
    uncased = WordPieceTokenizer.from_vocab_file(bert_vocab_path)
    unk = uncased.special.unk
    assert uncased.tokens(uncased.encode("Héllo Ça")) == ["hello", "ca"]  # accents stripped
    assert uncased.encode("a" * 101).tolist() == [unk]  # over 100 characters: one [UNK]
    assert unk not in uncased.encode("a" * 100).tolist()
    assert uncased.tokens(uncased.encode("北京")) == ["北", "京"]  # one token per CJK character
    assert uncased.encode("\x00\x01\u200b").tolist() == []
    # Raw text that spells a special token stays text, as in google-research/bert (transformers
    # would match it as the special token): a corpus cannot inject [MASK] or [SEP].
    assert uncased.tokens(uncased.encode("[MASK] [SEP]")) == ["[", "mask", "]", "[", "sep", "]"]
    cased = WordPieceTokenizer.from_vocab_file(bert_vocab_path, lowercase=False)
    assert cased.encode("Hello").tolist() != uncased.encode("Hello").tolist()
    assert uncased.special == WordPieceTokenizer.from_vocab_file(bert_vocab_path).special
    assert (uncased.special.pad, uncased.special.unk, uncased.special.cls, uncased.special.sep,
            uncased.special.mask) == (0, 100, 101, 102, 103)


def test_wordpiece_word_start_mask_and_decode(bert_vocab_path):
    tok = WordPieceTokenizer.from_vocab_file(bert_vocab_path)
    mask = tok.word_start_mask()
    assert mask.shape == (30522,) and mask.dtype == bool
    ids = tok.encode("Tokenization unaffordable")
    assert tok.tokens(ids) == ["token", "##ization", "una", "##ff", "##ord", "##able"]
    assert mask[ids].tolist() == [True, False, True, False, False, False]
    assert tok.decode(ids) == "tokenization unaffordable"
    assert tok.special_mask().sum() == 5 and tok.special_mask()[[0, 100, 101, 102, 103]].all()


@pytest.fixture(scope="module")
def training_sentences():
    with open(demo_corpus_path(), encoding="utf-8") as f:
        lines = (line.strip() for line in f)
        return list(itertools.islice((line for line in lines if line), 4000))


def check_roundtrip(tokenizer, texts, tmp_path):
    tokenizer.save(str(tmp_path / "tok"))
    for loaded in (load_tokenizer(str(tmp_path / "tok")), pickle.loads(pickle.dumps(tokenizer))):
        assert type(loaded) is type(tokenizer) and loaded.vocab_size == tokenizer.vocab_size
        assert loaded.lowercase == tokenizer.lowercase and loaded.special == tokenizer.special
        assert ids_of(loaded, texts) == ids_of(tokenizer, texts)
        assert (loaded.word_start_mask() == tokenizer.word_start_mask()).all()


def test_train_wordpiece(training_sentences, tmp_path):
    tok = train_wordpiece(training_sentences, vocab_size=2000)
    assert tok.vocab_size <= 2000 and tok.vocab_size > 1500
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tok.special.as_array().tolist() == [0, 1, 2, 3, 4]
    texts = training_sentences[:200] + HARD_CASES
    check_roundtrip(tok, texts, tmp_path)
    ids = np.concatenate(tok.encode_batch(texts))
    assert (ids < tok.vocab_size).all() and (ids >= 0).all()
    assert not np.isin(ids, [0, 2, 3, 4]).any()  # plain text never yields [PAD]/[CLS]/[SEP]/[MASK]
    mask = tok.word_start_mask()
    pieces = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    assert mask.tolist() == [not p.startswith("##") for p in pieces]
    assert 0 < (~mask).sum() < tok.vocab_size
    # Training keeps case when asked.
    cased = train_wordpiece(training_sentences[:500], vocab_size=500, lowercase=False)
    assert not cased.lowercase and any(p[:1].isupper() for p in map(cased.id_to_token,
                                                                     range(cased.vocab_size)))


@pytest.mark.slow
def test_train_wordpiece_gives_the_same_ids_every_time(demo_articles):
    # tokenizers' trainer orders equally frequent merges differently from run to run (on a
    # real corpus the tokens agree; on a few hundred sentences even they may not).
    sentences = [s for article in demo_articles for s in article]
    vocabularies = {tuple(map(tok.id_to_token, range(tok.vocab_size)))
                    for tok in (train_wordpiece(sentences, vocab_size=4096) for _ in range(3))}
    assert len(vocabularies) == 1


def test_train_sentencepiece(training_sentences, tmp_path):
    tok = train_sentencepiece(training_sentences, vocab_size=1000)
    assert isinstance(tok, SentencePieceTokenizer) and tok.vocab_size == 1000
    assert [tok.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert tok.special.as_array().tolist() == [0, 1, 2, 3, 4]
    texts = training_sentences[:200] + HARD_CASES
    check_roundtrip(tok, texts, tmp_path)
    sentence = training_sentences[3]
    ids = tok.encode(sentence)
    assert tok.decode(ids) == " ".join(sentence.lower().split())
    mask = tok.word_start_mask()
    assert mask[tok.special.as_array()].all()
    assert all(mask[i] == tok.id_to_token(i).startswith("\u2581") for i in range(5, 1000))
    assert tok.token_to_id("[MASK]") == 4 and tok.token_to_id("no-such-piece-xyz") is None


def test_vocab_smaller_than_the_specials(training_sentences):
    for train in (train_wordpiece, train_sentencepiece):
        with pytest.raises(UserError, match="must exceed the 5 special tokens"):
            train(training_sentences[:10], vocab_size=5)
    with pytest.raises(UserError, match="lacks the special tokens"):
        WordPieceTokenizer(["[PAD]", "[UNK]", "a", "b"])
