"""Masking statistics on real text: Wikipedia articles, the real bert-base-uncased vocabulary, laid
out as BERT lays out its examples ([CLS] A [SEP] B [SEP] [PAD]...)."""

import bz2
import html
import pickle
import re

import numpy as np
import pytest
from scipy import stats

from bertjax.data.masking import Masker
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.tokenizer import load_tokenizer
from bertjax.core.errors import UserError

STRATEGIES = ("token", "whole_word", "span")


def _wikipedia_sentences(dump_path: str) -> list[list[str]]:
    """Articles as lists of sentences: a rough strip of the MediaWiki markup, enough for stats."""
    xml = bz2.open(dump_path, "rt", encoding="utf-8").read()
    documents = []
    for page in re.findall(r"<text[^>]*>(.*?)</text>", xml, re.S):
        text = html.unescape(page)
        text = re.sub(r"<ref[^>]*/>|<ref.*?</ref>|<!--.*?-->", " ", text, flags=re.S)
        for _ in range(3):  # nested templates and tables, innermost first
            text = re.sub(r"\{\{[^{}]*\}\}|\{\|[^{}]*?\|\}", " ", text, flags=re.S)
        text = re.sub(r"\[\[(?:[^\[\]|]*\|)?([^\[\]]*)\]\]", r"\1", text)
        text = re.sub(r"<[^>]+>|'{2,}|\[https?://\S+", " ", text)
        lines = [line.strip() for line in text.split("\n")]
        prose = [line for line in lines if len(line) > 40 and line[0] not in "*|!{}=#:;[<"]
        sentences = [s for line in prose for s in re.split(r"(?<=[.!?])\s+", line) if s]
        if len(sentences) >= 2:
            documents.append(sentences)
    return documents


@pytest.fixture(scope="module")
def tokenizer(bert_vocab_path):
    return load_tokenizer(bert_vocab_path)


@pytest.fixture(scope="module")
def documents(tokenizer, wikipedia_dump_path):
    """Each article as a list of int32 sentence arrays (~530k tokens in all)."""
    texts = _wikipedia_sentences(wikipedia_dump_path)
    flat = tokenizer.encode_batch([s for doc in texts for s in doc])
    bounds = np.cumsum([0] + [len(doc) for doc in texts])
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _lay_out(documents, tokenizer, length: int, seed: int) -> np.ndarray:
    """BERT's create_instances_from_document, without the random-next pairs: chunks of
    consecutive sentences (10% shorter targets), split into A and B, trimmed, padded."""
    rng = np.random.default_rng(seed)
    special = tokenizer.special
    rows = []
    for doc in documents:
        i = 0
        while i < len(doc):
            target = length - 3 if rng.random() >= 0.1 else int(rng.integers(2, length - 3))
            chunk, size = [], 0
            while i < len(doc) and size < target:
                chunk.append(doc[i])
                size += len(doc[i])
                i += 1
            if len(chunk) < 2:
                continue
            cut = int(rng.integers(1, len(chunk)))
            a, b = np.concatenate(chunk[:cut]), np.concatenate(chunk[cut:])
            while len(a) + len(b) > length - 3:
                longer = a if len(a) > len(b) else b
                longer = longer[1:] if rng.random() < 0.5 else longer[:-1]
                a, b = (longer, b) if len(a) > len(b) else (a, longer)
            seq = np.concatenate([[special.cls], a, [special.sep], b, [special.sep]])
            rows.append(np.pad(seq, (0, length - len(seq)), constant_values=special.pad))
    return np.stack(rows).astype(np.int32)


@pytest.fixture(scope="module")
def examples128(documents, tokenizer):
    return _lay_out(documents, tokenizer, 128, seed=0)


@pytest.fixture(scope="module")
def examples512(documents, tokenizer):
    return _lay_out(documents, tokenizer, 512, seed=1)


def _masker(tokenizer, unigram_counts=None, **config) -> Masker:
    return Masker(MaskingConfig(**config), vocab_size=tokenizer.vocab_size,
                  mask_id=tokenizer.special.mask, special_ids=tokenizer.special.as_array(),
                  word_start=tokenizer.word_start_mask(), unigram_counts=unigram_counts)


def _mask_all(masker, examples, max_predictions, seed, batch=256) -> dict:
    out = []
    for i in range(0, len(examples), batch):
        rngs = [np.random.default_rng([seed, j]) for j in range(i, min(i + batch, len(examples)))]
        out.append(masker.mask_batch(examples[i:i + batch], max_predictions, rngs))
    return {key: np.concatenate([o[key] for o in out]) for key in out[0]}


def _outcome(out, mask_id) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per prediction slot: real?, what happened (0 [MASK], 1 another token, 2 unchanged), and
    the token now in the input there. A random draw can equal the original (p ~ 1/30k): it then
    counts as unchanged, which the tolerances absorb."""
    real = out["masked_weights"] > 0
    rows = np.arange(len(real))[:, None]
    now = out["input_ids"][rows, out["masked_positions"]]
    outcome = np.where(now == mask_id, 0, np.where(now == out["masked_ids"], 2, 1))
    return real, outcome, now


def _check_layout(tokenizer, examples, out, max_predictions):
    """Shapes, sorted positions, padding, specials untouched, labels = original ids."""
    special = tokenizer.special_mask()
    real = out["masked_weights"] > 0
    assert out["masked_positions"].shape == (len(examples), max_predictions)
    assert not np.any(out["masked_positions"][~real]) and not np.any(out["masked_ids"][~real])
    positions = np.where(real, out["masked_positions"], 10**6 + np.arange(max_predictions))
    assert np.all(np.diff(positions, axis=1) > 0)  # sorted and distinct
    rows = np.arange(len(examples))[:, None]
    assert np.array_equal(out["masked_ids"][real], examples[rows, out["masked_positions"]][real])
    assert not special[out["masked_ids"][real]].any()  # never a special token, [PAD] included
    changed = out["input_ids"] != examples
    predicted = np.zeros_like(changed)
    predicted[np.nonzero(real)[0], out["masked_positions"][real]] = True
    assert not np.any(changed & ~predicted)  # only predicted tokens are touched


@pytest.fixture(scope="module")
def layouts(examples128, examples512):
    return {128: (examples128, 20), 512: (examples512, 80)}  # BERT's max_predictions_per_seq


@pytest.mark.parametrize("length", (128, 512))
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.slow
def test_rates_on_real_text(tokenizer, layouts, strategy, length):
    examples, max_predictions = layouts[length]
    masker = _masker(tokenizer, strategy=strategy)
    special = tokenizer.special_mask()
    candidates = 0
    outcomes, span_outcomes = [], []
    for seed in (0, 1):  # two epochs of dynamic masking over ~0.5M non-special tokens
        out = _mask_all(masker, examples, max_predictions, seed)
        _check_layout(tokenizer, examples, out, max_predictions)
        real, outcome, now = _outcome(out, tokenizer.special.mask)
        assert not special[now[real & (outcome == 1)]].any()
        candidates += int((~special[examples]).sum())
        outcomes.append(outcome[real])
        if strategy == "span":
            span_outcomes.append(_span_outcomes(examples, out, outcome))
    outcomes = np.concatenate(outcomes)
    assert outcomes.size / candidates == pytest.approx(0.15, abs=0.003)
    # Per token for token / whole_word (as Google does); per span for span (as SpanBERT does).
    units = np.concatenate(span_outcomes) if strategy == "span" else outcomes
    assert units.size > 30_000
    shares = np.bincount(units, minlength=3) / units.size
    np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.01)


def _span_outcomes(examples, out, outcome) -> np.ndarray:
    """One outcome per span (runs of consecutive predicted positions); every token of a span
    must share it."""
    per_span = []
    for row in range(len(examples)):
        n = int(out["masked_weights"][row].sum())
        if n == 0:
            continue
        positions = out["masked_positions"][row, :n]
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        for run in np.split(np.arange(n), breaks):
            kinds = outcome[row, run]
            # A random span whose draw happened to equal the original at some token still
            # reads as "random" at the others; [MASK] never mixes with anything.
            assert len(set(kinds.tolist())) == 1 or 0 not in kinds
            per_span.append(1 if 1 in kinds else kinds[0])
    return np.array(per_span)


def _words(row, special, starts) -> list[list[int]]:
    """Word groups, written independently of the masker: a word-start token (no "##") or a token
    after a special token opens a word; specials belong to none."""
    words, previous_special = [], True
    for i, token in enumerate(row.tolist()):
        if special[token]:
            previous_special = True
            continue
        if starts[token] or previous_special:
            words.append([])
        words[-1].append(i)
        previous_special = False
    return words


def test_whole_word_selects_only_whole_words(tokenizer, examples128):
    masker = _masker(tokenizer, strategy="whole_word")
    rows = examples128[:800]
    out = _mask_all(masker, rows, 20, seed=3)
    special, starts = tokenizer.special_mask(), tokenizer.word_start_mask()
    partial_words_seen = 0
    for row, positions, weights in zip(rows, out["masked_positions"], out["masked_weights"]):
        chosen = set(positions[weights > 0].tolist())
        for word in _words(row, special, starts):
            hit = chosen.intersection(word)
            assert not hit or len(hit) == len(word), "a word was only partly selected"
            partial_words_seen += len(hit) > 1
    assert partial_words_seen > 100  # multi-token words were selected, and whole


def test_whole_word_matches_googles_loop(tokenizer, examples128):
    """Oracle: google-research/bert create_masked_lm_predictions' loop over shuffled words (with
    the same shuffle: the masker's first draw is rng.permutation(number of words))."""
    masker = _masker(tokenizer, strategy="whole_word")
    special, starts = tokenizer.special_mask(), tokenizer.word_start_mask()
    for k, row in enumerate(examples128[:400]):
        words = _words(row, special, starts)
        n = int((~special[row]).sum())
        budget = min(20, max(1, round(n * 0.15)))
        order = np.random.default_rng(k).permutation(len(words))
        expected = []
        for index_set in (words[i] for i in order):
            if len(expected) >= budget:
                break
            if len(expected) + len(index_set) > budget:
                continue
            expected.extend(index_set)
        out = masker(row, 20, np.random.default_rng(k))
        got = out["masked_positions"][out["masked_weights"] > 0]
        assert got.tolist() == sorted(expected)


def test_token_positions_are_uniform(tokenizer, examples128):
    """One example masked 20,000 times: every non-special position equally often."""
    masker = _masker(tokenizer, strategy="token")
    row = examples128[np.argmax((examples128 == tokenizer.special.pad).sum(1))]  # a short one
    n = int((~tokenizer.special_mask()[row]).sum())
    out = _mask_all(masker, np.repeat(row[None], 20_000, 0), 20, seed=4, batch=2000)
    hits = np.bincount(out["masked_positions"][out["masked_weights"] > 0], minlength=len(row))
    candidates = ~tokenizer.special_mask()[row]
    assert not hits[~candidates].any()
    assert stats.chisquare(hits[candidates]).pvalue > 1e-3
    assert hits.sum() == 20_000 * min(20, max(1, round(n * 0.15)))


def test_spans_structure_and_length_law(tokenizer, layouts):
    """Spans rebuilt from the outputs: whole words inside one segment, never touching each other,
    left/right/offset fields right; drawn lengths follow the renormalized geometric law; only the
    last span drawn for an example may be cut short by the budget."""
    masker = _masker(tokenizer, strategy="span")
    special, starts = tokenizer.special_mask(), tokenizer.word_start_mask()
    # The law written out here, not taken from the masker: Geometric(0.2) on 1..10, renormalized.
    pmf = 0.2 * 0.8 ** np.arange(10)
    pmf /= pmf.sum()
    np.testing.assert_allclose(masker.config.span_length_pmf(), pmf)
    drawn, realized, cut = [], [], 0
    for length, rows in ((128, 2000), (512, 600)):
        examples, max_predictions = layouts[length]
        examples = examples[:rows]
        out = _mask_all(masker, examples, max_predictions, seed=7)
        for j, row in enumerate(examples):
            n = int(out["masked_weights"][j].sum())
            positions = out["masked_positions"][j, :n]
            runs = np.split(positions, np.flatnonzero(np.diff(positions) != 1) + 1) if n else []
            k = 0
            spans = []
            for run in runs:
                first, end = int(run[0]), int(run[-1]) + 1
                fields = slice(k, k + len(run))
                assert np.all(out["span_left"][j, fields] == first - 1)
                assert np.all(out["span_right"][j, fields] == end)
                assert np.array_equal(out["span_offset"][j, fields], np.arange(len(run)))
                # Whole words: opens a word, and the next token is no continuation of it.
                assert starts[row[first]] or special[row[first - 1]]
                assert special[row[end]] or starts[row[end]]
                assert not special[row[first:end]].any()
                words = int(np.sum(starts[row[first:end]])) + (not starts[row[first]])
                assert 1 <= words <= 10
                spans.append((first, end, words))
                k += len(run)
            assert not out["span_left"][j, n:].any() and not out["span_offset"][j, n:].any()
            chosen = masker.choose_spans(row, max_predictions, np.random.default_rng([7, j]))
            assert sorted(zip(chosen.first.tolist(), chosen.end.tolist(),
                              chosen.words.tolist())) == spans
            if len(chosen.words):
                assert np.array_equal(chosen.words[:-1], chosen.drawn_words[:-1])
                assert 1 <= chosen.words[-1] <= chosen.drawn_words[-1]
                cut += int(chosen.words[-1] < chosen.drawn_words[-1])
            drawn.append(chosen.drawn_words)
            realized.append(chosen.words)
    drawn, realized = np.concatenate(drawn), np.concatenate(realized)
    assert drawn.size > 15_000 and drawn.max() <= 10
    histogram = np.bincount(drawn, minlength=11)[1:]
    assert stats.chisquare(histogram, pmf * drawn.size).pvalue > 1e-3
    assert drawn.mean() == pytest.approx(3.797, abs=0.06)
    assert np.sum(np.arange(1, 11) * pmf) == pytest.approx(3.797, abs=1e-3)
    # Budgets do cut last spans, which is why realized spans are shorter on average.
    assert cut > 0 and realized.mean() < drawn.mean()


def test_unigram_replacements_follow_counts(tokenizer, examples128):
    special = tokenizer.special_mask()
    # Corpus counts with the layout's [CLS]/[SEP]/[PAD] in them: the masker must ignore those.
    counts = np.bincount(examples128.ravel(), minlength=tokenizer.vocab_size)
    assert counts[special].sum() > 0
    masker = _masker(tokenizer, unigram_counts=counts, random_token_source="unigram",
                     mask_token_prob=0.0, random_token_prob=1.0)
    out = _mask_all(masker, examples128, 20, seed=8)
    real, _, drawn = _outcome(out, tokenizer.special.mask)
    drawn = drawn[real]
    assert drawn.size > 60_000 and not special[drawn].any()
    probs = np.where(special, 0, counts) / np.where(special, 0, counts).sum()
    top = np.argsort(probs)[::-1][:100]
    observed = np.bincount(drawn, minlength=tokenizer.vocab_size)
    rest = np.ones(tokenizer.vocab_size, bool)
    rest[top] = False
    observed = np.append(observed[top], observed[rest].sum())
    expected = np.append(probs[top], probs[rest].sum()) * drawn.size
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_uniform_replacements_cover_the_ordinary_vocabulary(tokenizer, examples128):
    special = tokenizer.special_mask()
    masker = _masker(tokenizer, mask_token_prob=0.0, random_token_prob=1.0)
    out = _mask_all(masker, examples128, 20, seed=9)
    real, _, drawn = _outcome(out, tokenizer.special.mask)
    drawn = drawn[real]
    assert not special[drawn].any()
    ordinary = np.flatnonzero(~special)
    buckets = np.array_split(ordinary, 50)  # 50 groups of consecutive ids
    observed = [np.isin(drawn, b).sum() for b in buckets]
    expected = np.array([len(b) for b in buckets]) / ordinary.size * drawn.size
    assert stats.chisquare(observed, expected).pvalue > 1e-3


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_reproducible_and_batch_equals_single(tokenizer, examples128, strategy):
    masker = _masker(tokenizer, strategy=strategy, random_token_prob=0.2)
    rows = examples128[:64]
    batch = masker.mask_batch(rows, 20, [np.random.default_rng([1, j]) for j in range(64)])
    again = masker.mask_batch(rows, 20, [np.random.default_rng([1, j]) for j in range(64)])
    other = masker.mask_batch(rows, 20, [np.random.default_rng([2, j]) for j in range(64)])
    assert batch.keys() == again.keys()
    for key in batch:
        assert np.array_equal(batch[key], again[key])
    assert not np.array_equal(batch["masked_positions"], other["masked_positions"])
    assert not np.array_equal(batch["input_ids"], other["input_ids"])
    for j in range(0, 64, 7):
        single = masker(rows[j], 20, np.random.default_rng([1, j]))
        assert all(np.array_equal(single[key], batch[key][j]) for key in batch)
        assert single["input_ids"].dtype == np.int32
        assert single["masked_weights"].dtype == np.float32
    # Data-loader workers get the masker by pickling.
    copy = pickle.loads(pickle.dumps(masker))
    assert np.array_equal(copy(rows[0], 20, np.random.default_rng([1, 0]))["input_ids"],
                          batch["input_ids"][0])


def test_edge_cases(tokenizer):
    s = tokenizer.special
    masker = _masker(tokenizer, strategy="span")
    empty = np.array([s.cls, s.sep, s.sep, s.pad, s.pad], np.int32)
    out = masker(empty, 4, np.random.default_rng(0))
    assert not out["masked_weights"].any() and np.array_equal(out["input_ids"], empty)
    words = tokenizer.encode("the quick brown fox jumps over the lazy dog " * 4)
    row = np.concatenate([[s.cls], words, [s.sep]]).astype(np.int32)
    for strategy in STRATEGIES:
        wide = _masker(tokenizer, strategy=strategy)(row, 100, np.random.default_rng(1))
        assert wide["masked_positions"].shape == (100,)
        assert wide["masked_weights"].sum() == round(len(words) * 0.15)
        tight = _masker(tokenizer, strategy=strategy)(row, 2, np.random.default_rng(1))
        assert 1 <= tight["masked_weights"].sum() <= 2


@pytest.mark.parametrize("bad", [
    dict(strategy="ngram"), dict(mask_prob=0.0), dict(mask_prob=1.5), dict(mask_prob="0.15"),
    dict(mask_token_prob=-0.1), dict(random_token_prob=1.1), dict(mask_token_prob=True),
    dict(mask_token_prob=0.9, random_token_prob=0.2), dict(random_token_source="zipf"),
    dict(span_geometric_p=0.0), dict(max_span_length=0), dict(max_span_length=2.5),
])
def test_bad_config_is_a_user_error(bad):
    with pytest.raises(UserError):
        MaskingConfig(**bad)


def test_bad_arguments_are_user_errors(tokenizer):
    s = tokenizer.special
    good = dict(vocab_size=tokenizer.vocab_size, mask_id=s.mask, special_ids=s.as_array(),
                word_start=tokenizer.word_start_mask())
    unigram = MaskingConfig(random_token_source="unigram")
    bad_masker_args = [
        (unigram, {}), (unigram, dict(unigram_counts=np.ones(7))),
        (unigram, dict(unigram_counts=-np.ones(tokenizer.vocab_size))),
        (MaskingConfig(), dict(word_start=np.ones(7, bool))),
        (MaskingConfig(), dict(mask_id=tokenizer.vocab_size)),
        (MaskingConfig(), dict(special_ids=[-1])),
    ]
    for config, change in bad_masker_args:
        with pytest.raises(UserError):
            Masker(config, **{**good, **change})
    masker = Masker(MaskingConfig(strategy="span"), **good)
    row = np.array([s.cls, 2000, 2001, s.sep], np.int32)
    rng = np.random.default_rng(0)
    for call in (lambda: masker(np.array([s.cls, tokenizer.vocab_size, s.sep]), 2, rng),
                 lambda: masker(np.array([s.cls, -3, s.sep]), 2, rng),
                 lambda: masker(row.astype(np.float32), 2, rng),
                 lambda: masker(row[None], 2, rng),
                 lambda: masker(row, 0, rng),
                 lambda: masker(row, 2, 0),
                 lambda: masker(row[1:], 2, rng),  # span masking without [CLS] in front
                 lambda: masker.mask_batch(np.stack([row, row]), 2, [rng])):
        with pytest.raises(UserError):
            call()


def test_modernberts_thirty_percent_keeps_the_80_10_10_split(tokenizer, examples128):
    """ModernBERT masks 30% (configs/modernbert.py): the rate doubles, the split of what happens
    to a selected token does not (checked per token on ~0.25M candidates)."""
    masker = _masker(tokenizer, strategy="token", mask_prob=0.3)
    max_predictions = 40  # 30% of 128, with room: the budget must not clip the rate
    out = _mask_all(masker, examples128, max_predictions, seed=0)
    _check_layout(tokenizer, examples128, out, max_predictions)
    real, outcome, _ = _outcome(out, tokenizer.special.mask)
    candidates = int((~tokenizer.special_mask()[examples128]).sum())
    assert real.sum() / candidates == pytest.approx(0.3, abs=0.005)
    shares = np.bincount(outcome[real], minlength=3) / real.sum()
    np.testing.assert_allclose(shares, [0.8, 0.1, 0.1], atol=0.01)
