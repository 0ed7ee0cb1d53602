"""Example mode "documents" (data.separate_documents): RoBERTa's full-sentence rows, each token
labelled with its document and its position inside it, so that packed documents do not attend to
one another; the batches carry the labels and a run trains on them."""

import numpy as np
import pytest

import cli_in_process
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.examples import ExampleSource
from bertjax.data.length_schedule import LengthSchedule, Phase
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.pretraining import PretrainingData, positions_in_documents
from cli_checks import assert_one_line_error
from pretrain_runs import run_child
from test_modernbert_runs import modern_args
from test_pretrain import logged


@pytest.fixture(scope="module")
def corpus(small_corpus_dir):
    return PreparedCorpus.open(small_corpus_dir)


def _sources(corpus):
    documents = np.arange(corpus.num_documents)
    special = corpus.tokenizer.special
    return (ExampleSource(corpus, documents, mode="full_sentences", special=special),
            ExampleSource(corpus, documents, mode="documents", special=special))


def test_documents_mode_labels_full_sentence_rows_by_document(corpus):
    plain, labelled = _sources(corpus)
    sep = corpus.tokenizer.special.sep
    rng = np.random.default_rng(0)
    crossing = 0
    for seq_len in (32, 512):
        chunks = labelled.chunks(seq_len)
        assert np.array_equal(chunks, plain.chunks(seq_len))
        for chunk in chunks[::max(1, len(chunks) // 500)]:
            a, b = plain.build(chunk, seq_len, rng), labelled.build(chunk, seq_len, rng)
            assert np.array_equal(a.input_ids, b.input_ids) and a.pack_ids is None
            packs = b.pack_ids
            assert packs.shape == b.input_ids.shape and packs[0] == 1
            assert np.all(np.diff(packs) >= 0) and np.all(np.diff(packs) <= 1)
            # A new document starts right after a [SEP] that ends the previous one.
            for start in np.flatnonzero(np.diff(packs)) + 1:
                assert b.input_ids[start - 1] == sep
            crossing += packs[-1] > 1
    assert crossing >= 5  # rows that really hold several documents


def test_positions_restart_at_each_document():
    packs = np.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
    assert positions_in_documents(packs).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2],
                                                      [0, 1, 2, 3, 4, 5, 6, 7]]


def test_batches_carry_pack_ids_and_positions(corpus):
    schedule = LengthSchedule((Phase(512, 160, 0),))
    data = PretrainingData(corpus, mode="documents", masking=MaskingConfig(mask_prob=0.3),
                           schedule=schedule, global_batch_size=32, seed=0, workers=0,
                           eval_fraction=0.25)
    batch = data.eval_batches(schedule.phases[0], 1)[0]
    packs, mask = batch["pack_ids"], batch["input_mask"].astype(bool)
    assert np.array_equal(packs > 0, mask) and packs.max() >= 2
    assert np.array_equal(batch["positions"], positions_in_documents(packs))


@pytest.mark.slow
def test_a_modernbert_run_trains_on_documents_kept_apart(tmp_path, small_corpus_dir):
    """configs/modernbert.py sets data.separate_documents: the job compiles its step for the
    packing fields and trains on them."""
    workdir = str(tmp_path / "run")
    result = run_child(modern_args(workdir, small_corpus_dir, **{
        "train.steps": 3, "schedule.long_fraction": 0.0, "train.eval_every": 0}))
    assert result.returncode == 0, result.stderr[-2000:]
    losses = [r["loss"] for r in logged(workdir) if "loss" in r]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_objectives_that_cannot_keep_documents_apart_are_refused(tmp_path):
    for objective in ("bert", "electra"):
        workdir = tmp_path / objective
        run = cli_in_process.run("main", "--config=configs/tiny.py", f"--workdir={workdir}",
                                 "--config.data.input=nowhere.txt",
                                 f"--config.objective={objective}",
                                 "--config.data.separate_documents=true")
        assert_one_line_error(run.returncode, run.stderr, "data.separate_documents",
                              f"objective {objective} does not support it")
        assert not workdir.exists()
