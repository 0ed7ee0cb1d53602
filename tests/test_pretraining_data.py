"""Pretraining examples, batches and the checkpointable iterator, on real Wikipedia text.

Oracles: ports of google-research/bert's chunking loop and truncate_seq_pair, fairseq's
"complete" block packing, and the corpus itself (every example's text is found in it).
"""

import json
import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.data import corpus as corpus_format
from bertjax.data import schema
from bertjax.data.chunk_permutation import Permutation
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.examples import greedy_boundaries, trimmed_lengths
from bertjax.data.batch_report import batch_statistics, describe_batch
from bertjax.data.length_schedule import LengthSchedule, Phase
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.pretraining import PretrainingData
from bertjax.data.tokenizer import WordPieceTokenizer
from bertjax.core.errors import UserError
from bertjax.train import compilation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = {"input_ids", "segment_ids", "input_mask", "masked_positions", "masked_ids",
          "masked_weights"}
TWO_PHASES = LengthSchedule((Phase(32, 5, 0), Phase(64, 10, 6)))


@pytest.fixture(scope="module")
def wiki_dir(tmp_path_factory, bert_vocab_path) -> str:
    """106 real Wikipedia articles (~570k tokens), BERT's vocabulary, two shards."""
    with open(demo_corpus_path(), encoding="utf-8") as f:
        documents = [d.split("\n") for d in f.read().strip().split("\n\n")]
    tokenizer = WordPieceTokenizer.from_vocab_file(bert_vocab_path)
    ids = iter(tokenizer.encode_batch([s for d in documents for s in d]))
    tokenized = [[next(ids) for _ in d] for d in documents]
    directory = str(tmp_path_factory.mktemp("wiki"))
    half = len(tokenized) // 2
    stats = [corpus_format.write_shard(directory, i, part, tokenizer.vocab_size)
             for i, part in enumerate((tokenized[:half], tokenized[half:]))]
    corpus_format.write_manifest(directory, stats, tokenizer.vocab_size)
    tokenizer.save(os.path.join(directory, corpus_format.TOKENIZER_DIR))
    return directory


@pytest.fixture(scope="module")
def wiki(wiki_dir) -> PreparedCorpus:
    return PreparedCorpus.open(wiki_dir)


def make_data(corpus, **overrides) -> PretrainingData:
    settings = dict(mode="nsp", masking=MaskingConfig(), schedule=TWO_PHASES, global_batch_size=8,
                    seed=3, workers=0, prefetch=3)
    settings.update(overrides)
    return PretrainingData(corpus, **settings)


def assert_same_batch(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        assert got[key].tobytes() == want[key].tobytes(), key


def is_slice(part: np.ndarray, full: np.ndarray) -> bool:
    if part.size > full.size:
        return False
    windows = np.lib.stride_tricks.sliding_window_view(full, part.size)
    return bool((windows == part).all(axis=1).any())


def unmasked(batch: dict, row: int) -> np.ndarray:
    """A row's input_ids with its prediction targets put back."""
    ids = batch["input_ids"][row].copy()
    real = batch["masked_weights"][row] > 0
    ids[batch["masked_positions"][row][real]] = batch["masked_ids"][row][real]
    return ids


def document_of(corpus, sentence: int) -> int:
    return int(np.searchsorted(corpus.document_bounds, sentence, side="right")) - 1


# ---- the length schedule ------------------------------------------------------------------------

def test_bert_schedule_switches_to_long_sequences_for_the_last_fraction():
    schedule = LengthSchedule.bert(1000)
    assert schedule.phases == (Phase(128, 20, 0), Phase(512, 80, 900))
    assert schedule.phase_at(0).seq_len == 128 and schedule.phase_at(899).seq_len == 128
    assert schedule.phase_at(900).seq_len == 512 and schedule.phase_at(10**9).seq_len == 512
    assert LengthSchedule.bert(1000, long_fraction=0).phases == (Phase(128, 20, 0),)
    assert LengthSchedule.bert(1000, long_fraction=1).phases == (Phase(512, 80, 0),)
    assert LengthSchedule.bert(7, 0.3, (32, 5), (64, 10)).phases == (Phase(32, 5, 0),
                                                                     Phase(64, 10, 5))


@pytest.mark.parametrize("build", [
    lambda: Phase(4, 1, 0), lambda: Phase(32, 0, 0), lambda: Phase(32, 33, 0),
    lambda: Phase(32, 5, -1), lambda: LengthSchedule(()),
    lambda: LengthSchedule((Phase(32, 5, 3),)),
    lambda: LengthSchedule((Phase(32, 5, 0), Phase(64, 5, 0))),
    lambda: LengthSchedule.bert(0), lambda: LengthSchedule.bert(100, 1.5),
    lambda: LengthSchedule.bert(100, short=(3, 1)),
    lambda: LengthSchedule.bert(100).phase_at(-1)])
def test_bad_schedules_are_user_errors(build):
    with pytest.raises(UserError):
        build()


# ---- building blocks against their references ---------------------------------------------------

def test_greedy_boundaries_equal_a_sequential_walk():
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = int(rng.integers(1, 2000))
        lengths = np.full(n, 3) if trial % 5 == 0 else rng.integers(1, 60, n)  # 3: never merge
        total = np.concatenate([[0], np.cumsum(lengths)])
        budget = int(rng.integers(1, 100))

        def step(p):
            return np.minimum(np.searchsorted(total, total[p] + budget, side="right") - 1, n) \
                .clip(min=p + 1)

        walk = [0]
        while walk[-1] < n:
            walk.append(int(step(np.array([walk[-1]]))[0]))
        block = int(rng.integers(1, 300))
        assert greedy_boundaries(step, n, block=block).tolist() == walk, (trial, block)


def test_truncation_lengths_equal_bert_truncate_seq_pair():
    def bert_truncate(len_a, len_b, max_tokens):  # google-research/bert, minus the randomness
        while len_a + len_b > max_tokens:
            if len_a > len_b:
                len_a -= 1
            else:
                len_b -= 1
        return len_a, len_b

    for len_a in range(1, 30):
        for len_b in range(1, 30):
            for max_tokens in range(2, 40, 3):
                assert trimmed_lengths(len_a, len_b, max_tokens) == bert_truncate(
                    len_a, len_b, max_tokens)


def test_epoch_permutation_is_a_keyed_bijection():
    for n in (1, 2, 3, 17, 1000, 4097):
        order = Permutation(n, [1, 2])(np.arange(n))
        assert sorted(order.tolist()) == list(range(n))
    a, b = Permutation(1000, [1, 2])(np.arange(1000)), Permutation(1000, [1, 3])(np.arange(1000))
    assert not np.array_equal(a, b) and not np.array_equal(a, np.arange(1000))
    # Roughly uniform: where index 0 lands over many keys.
    landing = [Permutation(10, [k])(np.array([0]))[0] for k in range(2000)]
    assert np.bincount(landing, minlength=10).min() > 140


# ---- NSP pairs ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_nsp_chunks_equal_berts_document_loop(wiki):
    data = make_data(wiki)
    train_docs, _ = wiki.split_documents(0.01)
    budget = 32 - 3
    expected = []
    for document in train_docs:  # create_instances_from_document with target = max_num_tokens
        start, end = wiki.document_sentences(int(document))
        chunk_start, length = start, 0
        for s in range(start, end):
            length += int(wiki.sentence_lengths[s])
            if s == end - 1 or length >= budget:
                expected.append((chunk_start, s + 1))
                chunk_start, length = s + 1, 0
    assert [tuple(row) for row in data.chunk_table(32).tolist()] == expected


@pytest.mark.slow
def test_nsp_pairs_are_adjacent_text_or_another_documents(wiki):
    data = make_data(wiki)
    special = wiki.tokenizer.special
    train_docs = set(wiki.split_documents(0.01)[0].tolist())
    examples = data.examples(32, 0, 6000)
    positives = 0
    for example in examples:
        ids = example.input_ids
        seps = np.flatnonzero(ids == special.sep)
        assert ids.size <= 32 and ids[0] == special.cls and special.pad not in ids
        assert seps.size == 2 and seps[1] == ids.size - 1 and seps[0] >= 2
        a, b = ids[1:seps[0]], ids[seps[0] + 1:-1]
        assert b.size >= 1
        assert example.segment_ids.tolist() == [0] * (a.size + 2) + [1] * (b.size + 1)
        full_a, full_b = wiki.tokens(*example.a_sentences), wiki.tokens(*example.b_sentences)
        assert is_slice(a, full_a) and is_slice(b, full_b)
        if a.size < full_a.size or b.size < full_b.size:
            assert a.size + b.size == 32 - 3  # truncated only to fit
        doc_a = document_of(wiki, example.a_sentences[0])
        doc_b = document_of(wiki, example.b_sentences[0])
        assert document_of(wiki, example.a_sentences[1] - 1) == doc_a
        assert document_of(wiki, example.b_sentences[1] - 1) == doc_b
        assert doc_a in train_docs and doc_b in train_docs
        if example.nsp_label == 0:
            positives += 1
            assert example.b_sentences[0] == example.a_sentences[1] and doc_b == doc_a
        else:
            assert example.nsp_label == 1 and doc_b != doc_a
    assert abs(positives / len(examples) - 0.5) < 0.02


@pytest.mark.slow
def test_short_seq_prob_makes_short_examples(wiki):
    # Targets are reached a whole sentence at a time (as in BERT), so a short target still makes
    # an example of two sentences or more: the effect shows at lengths well above a sentence's.
    def short_fraction(prob):
        data = make_data(wiki, short_seq_prob=prob, schedule=LengthSchedule((Phase(128, 20, 0),)))
        return np.mean([e.input_ids.size < 96 for e in data.examples(128, 0, 1000)])

    never, bert, often = short_fraction(0.0), short_fraction(0.1), short_fraction(0.5)
    assert never < 0.03 and never + 0.03 < bert < 0.15 and often > 0.2


def test_nsp_batches_follow_the_schema(wiki):
    data = make_data(wiki)
    batch = next(data.train_iterator(0))
    assert batch.keys() == SCHEMA | {"nsp_label"}
    assert batch["input_ids"].shape == (8, 32) and batch["masked_ids"].shape == (8, 5)
    assert batch["masked_weights"].dtype == np.float32 and batch["nsp_label"].shape == (8,)
    assert all(v.dtype == np.int32 for k, v in batch.items() if k != "masked_weights")
    for row, example in enumerate(data.examples(32, 0, 8)):
        n = example.input_ids.size
        assert batch["input_mask"][row].tolist() == [1] * n + [0] * (32 - n)
        assert batch["segment_ids"][row, :n].tolist() == example.segment_ids.tolist()
        assert batch["nsp_label"][row] == example.nsp_label
        assert unmasked(batch, row)[:n].tolist() == example.input_ids.tolist()



def test_the_compiled_step_is_shaped_like_the_batches_built(wiki):
    """The job compiles from compilation.abstract_batch: it must agree with the builder's output."""
    data = make_data(wiki, mode="full_sentences", masking=MaskingConfig(strategy="span"))
    batch = next(data.train_iterator(0))
    abstract = compilation.abstract_batch(8, 32, 5, nsp=False, span=True)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == \
        {k: (v.shape, v.dtype) for k, v in abstract.items()}
    with pytest.raises(AssertionError, match=r"lacks \['nsp_label'\]"):
        schema.conform(batch, 8, 32, 5, nsp=True, span=True)

# ---- full sentences -----------------------------------------------------------------------------

def test_full_sentence_packs_equal_fairseq_complete_blocks(wiki):
    data = make_data(wiki, mode="full_sentences")
    train_docs, _ = wiki.split_documents(0.01)
    for seq_len in (32, 64):
        packs, current, size = [], [], 0
        for document in train_docs:  # fairseq TokenBlockDataset, break_mode="complete"
            start, end = wiki.document_sentences(int(document))
            for s in range(start, end):
                cost = int(wiki.sentence_lengths[s]) + (s == end - 1)  # the [SEP] after a document
                if size + cost <= seq_len - 2 or size == 0:
                    current.append(s)
                    size += cost
                else:
                    packs.append(current)
                    current, size = [s], cost
        packs.append(current)
        in_train = np.zeros(wiki.num_documents, bool)
        in_train[train_docs] = True
        ours = [[s for s in range(a, b) if in_train[document_of(wiki, s)]]
                for a, b in data.chunk_table(seq_len).tolist()]
        assert ours == packs


@pytest.mark.slow
def test_full_sentence_examples_are_the_packed_text(wiki):
    data = make_data(wiki, mode="full_sentences")
    special = wiki.tokenizer.special
    train_docs = set(wiki.split_documents(0.01)[0].tolist())
    n = data.num_chunks(64)
    examples = data.examples(64, 0, n)  # one epoch: every pack once
    assert sorted(e.a_sentences for e in examples) == [tuple(r) for r in
                                                       data.chunk_table(64).tolist()]
    for example in examples:
        start, end = example.a_sentences
        pieces = []
        for document in range(document_of(wiki, start), document_of(wiki, end - 1) + 1):
            if document in train_docs:
                doc_start, doc_end = wiki.document_sentences(document)
                pieces.append(wiki.tokens(max(start, doc_start), min(end, doc_end)))
        body = np.concatenate([np.append(p, special.sep) for p in pieces])[:-1][:64 - 2]
        assert example.input_ids.tolist() == [special.cls, *body.tolist(), special.sep]
        assert example.nsp_label == -1 and not example.segment_ids.any()

    # Full: no pack but the last has room for the sentence that starts the next one.
    def in_train(sentence):
        return document_of(wiki, sentence) in train_docs

    def cost(sentence):  # its tokens, and the [SEP] after it if it ends a document
        ends_document = sentence + 1 == wiki.document_bounds[document_of(wiki, sentence) + 1]
        return int(wiki.sentence_lengths[sentence]) + ends_document

    table = data.chunk_table(64).tolist()
    for (start, end), (next_start, next_end) in zip(table, table[1:]):
        used = sum(cost(s) for s in range(start, end) if in_train(s))
        following = next(s for s in range(next_start, next_end) if in_train(s))
        assert used <= 64 - 2 or end - start == 1
        assert used + cost(following) > 64 - 2
    batch = next(data.train_iterator(0))
    assert batch.keys() == SCHEMA and not batch["segment_ids"].any()


# ---- reproducibility, processes, dynamic masking -----------------------------------------------

def test_process_slices_concatenate_to_the_global_batch(wiki):
    whole = make_data(wiki)
    for step in (0, 7):  # 7 is in the 64-token phase
        want = next(whole.train_iterator(step))
        assert_same_batch(next(make_data(wiki).train_iterator(step)), want)
        for count in (2, 4):
            parts = [next(make_data(wiki, process_index=p, process_count=count)
                          .train_iterator(step)) for p in range(count)]
            assert_same_batch({k: np.concatenate([p[k] for p in parts]) for k in want}, want)
    other_seed = next(make_data(wiki, seed=4).train_iterator(0))
    assert not np.array_equal(other_seed["input_ids"], next(whole.train_iterator(0))["input_ids"])


def test_a_chunk_seen_again_in_the_next_epoch_gets_a_new_mask(wiki):
    schedule = LengthSchedule((Phase(64, 10, 0),))
    data = make_data(wiki, mode="full_sentences", schedule=schedule, global_batch_size=4)
    n = data.num_chunks(64)
    epoch1 = data.chunk_indices(64, np.arange(n, 2 * n))
    where_in_epoch1 = np.argsort(epoch1) + n
    different = 0
    for step in range(40):  # the first example of each step, and its chunk's next visit
        again = int(where_in_epoch1[data.chunk_indices(64, np.array([4 * step]))[0]])
        first = next(data.train_iterator(step))
        second = next(data.train_iterator(again // 4))
        assert np.array_equal(unmasked(first, 0), unmasked(second, again % 4))  # same text
        different += not np.array_equal(first["masked_positions"][0],
                                        second["masked_positions"][again % 4])
    assert different >= 38


# ---- save and restore ---------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_restored_iterator_reproduces_the_run_across_the_phase_switch(wiki, workers):
    with make_data(wiki).train_iterator() as reference:
        want = [next(reference) for _ in range(10)]
    states = {}
    with make_data(wiki, workers=workers).train_iterator() as batches:
        for step in range(10):
            if step in (3, 8):
                states[step] = json.loads(json.dumps(batches.get_state()))
            assert_same_batch(next(batches), want[step])
    assert [want[s]["input_ids"].shape[1] for s in (5, 6)] == [32, 64]
    with make_data(wiki, workers=workers).train_iterator() as restored:
        for step in (3, 8):
            restored.set_state(states[step])
            for expected in want[step:]:
                assert_same_batch(next(restored), expected)
    assert multiprocessing.active_children() == []  # close() joined every worker


def test_state_of_other_data_settings_is_refused(wiki):
    state = make_data(wiki).train_iterator(5).get_state()
    assert state["step"] == 5
    with pytest.raises(UserError, match="seed"):
        make_data(wiki, seed=9).train_iterator().set_state(state)
    with pytest.raises(UserError):
        make_data(wiki).train_iterator().set_state({"step": -1})


# ---- evaluation ---------------------------------------------------------------------------------

def test_eval_batches_are_fixed_and_come_from_held_out_documents(wiki):
    data = make_data(wiki, eval_fraction=0.05)
    phase = TWO_PHASES.phases[0]
    first, again = data.eval_batches(phase, 3), data.eval_batches(phase, 3)
    for a, b in zip(first, again):
        assert_same_batch(a, b)
    held_out = set(wiki.split_documents(0.05)[1].tolist())
    for example in data.examples(32, 0, 24, split="eval"):
        assert document_of(wiki, example.a_sentences[0]) in held_out
        assert document_of(wiki, example.b_sentences[0]) in held_out
    # A one-document held-out set borrows its NotNext segments from the other documents.
    lone = make_data(wiki, eval_fraction=0.01).examples(32, 0, 40, split="eval")
    assert len({document_of(wiki, e.a_sentences[0]) for e in lone}) == 1
    for example in lone:
        same = document_of(wiki, example.a_sentences[0]) == document_of(wiki,
                                                                        example.b_sentences[0])
        assert same == (example.nsp_label == 0)
    halves = [make_data(wiki, eval_fraction=0.05, process_index=p, process_count=2)
              .eval_batches(phase, 3) for p in range(2)]
    for i in range(3):
        assert_same_batch({k: np.concatenate([h[i][k] for h in halves]) for k in first[i]},
                          first[i])


# ---- bad input ----------------------------------------------------------------------------------

def test_bad_settings_are_user_errors(wiki):
    with pytest.raises(UserError, match="divisible"):
        make_data(wiki, global_batch_size=6, process_count=4)
    with pytest.raises(UserError, match="mode"):
        make_data(wiki, mode="xlnet")
    with pytest.raises(UserError):
        make_data(wiki, process_index=2, process_count=2)
    no_eval = make_data(wiki, eval_fraction=0.0)
    assert not no_eval.has_eval_data and make_data(wiki).has_eval_data
    with pytest.raises(UserError, match="eval_fraction"):
        no_eval.eval_batches(TWO_PHASES.phases[0], 1)
    one_document = PreparedCorpus([np.arange(5, 105, dtype=np.int32)],
                                  [np.array([0, 40, 100])], [np.array([0, 2])],
                                  np.ones(wiki.tokenizer.vocab_size), wiki.tokenizer)
    with pytest.raises(UserError, match="two documents"):
        make_data(one_document, eval_fraction=0.0)
    no_tokenizer = PreparedCorpus([np.arange(5, 105, dtype=np.int32)], [np.array([0, 40, 100])],
                                  [np.array([0, 1, 2])], np.ones(200))
    with pytest.raises(UserError, match="tokenizer"):
        make_data(no_tokenizer)


# ---- inspection ---------------------------------------------------------------------------------

def test_describe_batch_shows_targets_and_labels(wiki):
    tokenizer = wiki.tokenizer
    ids = [tokenizer.token_to_id(t) for t in "[CLS] the cat sat [SEP] it slept [SEP]".split()]
    pad, mask = tokenizer.special.pad, tokenizer.special.mask
    dog = tokenizer.token_to_id("dog")
    seen = ids[:2] + [mask] + ids[3:6] + [dog] + ids[7:] + [pad, pad]
    batch = {"input_ids": np.array([seen], np.int32),
             "input_mask": np.array([[1] * 8 + [0, 0]], np.int32),
             "masked_positions": np.array([[2, 6, 0]], np.int32),
             "masked_ids": np.array([[ids[2], ids[6], 0]], np.int32),
             "masked_weights": np.array([[1, 1, 0]], np.float32),
             "nsp_label": np.array([0], np.int32), "segment_ids": np.zeros((1, 10), np.int32)}
    assert describe_batch(batch, tokenizer, 5) == (
        "example 0: 8 tokens, 2 predictions, nsp_label 0 (IsNext)\n"
        "  [CLS] the [MASK](=cat) sat [SEP] it dog(=slept) [SEP]  + 2 x [PAD]")
    stats = batch_statistics([batch], tokenizer)
    assert stats["masked_fraction"] == 2 / 5 and stats["padding_fraction"] == 0.2
    assert stats["mask_token_fraction"] == 0.5 and stats["random_token_fraction"] == 0.5
    assert stats["nsp_positive_fraction"] == 1.0 and stats["tokens_per_example"] == 8


def test_batch_statistics_show_bert_masking(wiki):
    data = make_data(wiki, schedule=LengthSchedule((Phase(64, 10, 0),)), global_batch_size=32)
    with data.train_iterator() as batches:
        stats = batch_statistics([next(batches) for _ in range(20)], wiki.tokenizer)
    assert stats["examples"] == 640 and stats["seq_lens"] == [64]
    assert abs(stats["masked_fraction"] - 0.15) < 0.01
    assert abs(stats["mask_token_fraction"] - 0.8) < 0.03
    assert abs(stats["random_token_fraction"] - 0.1) < 0.02
    assert abs(stats["unchanged_fraction"] - 0.1) < 0.02
    assert abs(stats["nsp_positive_fraction"] - 0.5) < 0.06
    assert 0 <= stats["padding_fraction"] < 0.1


def _inspect(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "bertjax.data.inspect", *args], cwd=cwd,
                                capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_inspect_command_prints_and_dumps_batches(wiki_dir, tmp_path):
    dump = tmp_path / "batches.npz"
    result = _inspect("--config=configs/base.py", f"--config.data.prepared={wiki_dir}",
                      "--config.train.batch_size=4", "--config.schedule.short_seq_len=48",
                      "--config.schedule.short_max_predictions=8", "--batches=3", "--examples=2",
                      f"--dump={dump}")
    assert result.returncode == 0, result.stderr
    assert "[CLS]" in result.stdout and "[MASK](=" in result.stdout
    assert "nsp_positive_fraction" in result.stdout
    with np.load(dump) as arrays:
        assert set(arrays.files) == SCHEMA | {"nsp_label"}
        assert arrays["input_ids"].shape == (12, 48) and arrays["masked_ids"].shape == (12, 8)


@pytest.mark.slow
def test_inspect_command_reports_bad_input_in_one_line(wiki_dir):
    result = _inspect("--config=configs/base.py", f"--config.data.prepared={wiki_dir}",
                      "--batches=0")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("bertjax: error:") and result.stderr.count("\n") == 1
    result = _inspect("--config=configs/base.py", "--config.train.batch_size=6",
                      f"--config.data.prepared={wiki_dir}", "--config.schedule.short_seq_len=3")
    assert result.returncode == 2 and result.stderr.startswith("bertjax: error:")
