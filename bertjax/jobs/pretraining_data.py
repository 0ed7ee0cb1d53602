"""The pretraining job's data: the prepared corpus (prepared on first use, by process 0) and the
batch iterator over it."""

from __future__ import annotations

import os

from bertjax.core import storage, transfer
from bertjax.data import corpus, preparation_engine, sources, streamed_corpus, tokenizer_training
from bertjax.data.inputs import NAMED_INPUTS
from bertjax.jobs import multilingual_data
from bertjax.data.pretraining import PretrainingData
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.core.errors import UserError, name_copy
from bertjax.settings.pretrain import PretrainSettings


def prepared_corpus(s: PretrainSettings, workdir: str, required: Tokenizer | None, *,
                    may_prepare: bool = True) -> corpus.PreparedCorpus:
    """Opens the prepared corpus, preparing it first (and training a vocabulary) when needed.

    `required` is the init checkpoint's own tokenizer (model.preset=from_checkpoint): the corpus
    must be tokenized with it. `may_prepare=False` (processes other than 0 of a multi-process
    run, which prepares it once for all) refuses a missing corpus instead.
    """
    if multilingual_data.is_multilingual(s):
        return multilingual_data.prepared_corpus(s, workdir, required, may_prepare=may_prepare)
    d = s.data
    directory = d.prepared_dir(workdir)
    if storage.is_url(directory):  # a corpus on a bucket (remote_inputs.localized checked it)
        prepared = streamed_corpus.open_streamed(directory)
        _check_vocabulary(prepared, directory, required)
        return prepared
    if not os.path.exists(os.path.join(directory, corpus.MANIFEST)):
        if not may_prepare:
            raise UserError(f"the prepared corpus {directory} is missing on this host although "
                            "process 0 has it: with several hosts, the workdir (or "
                            "data.prepared) must be on a file system every host shares")
        inputs, input_format = d.inputs()
        if d.tokenizer:
            tokenizer = load_tokenizer(d.tokenizer, lowercase=d.lowercase)
        elif required is not None:
            tokenizer = required
        else:
            tokenizer = tokenizer_training.build_tokenizer(
                inputs, input_format, kind=d.tokenizer_type, vocab_size=d.vocab_size,
                lowercase=d.lowercase)
        preparation_engine.prepare(inputs, input_format, directory, tokenizer,
                                   workers=max(1, os.cpu_count() or 1))
    prepared = corpus.PreparedCorpus.open(directory)
    _check_vocabulary(prepared, directory, required)
    return prepared


def _check_vocabulary(prepared: corpus.PreparedCorpus, directory: str,
                      required: Tokenizer | None) -> None:
    if required is not None and not corpus.same_vocabulary(prepared.tokenizer, required):
        raise UserError(f"the corpus in {directory} was tokenized with another vocabulary than "
                        "the init checkpoint's; prepare it with that one (a new data.prepared)")


def check_inputs(s: PretrainSettings, workdir: str) -> None:
    """What preparing a missing corpus reads, refused before the workdir is created: no corpus
    named, an input or data.tokenizer that is not there. A prepared corpus needs neither. (The
    demo corpora are fetched into the cache when the corpus is prepared.)"""
    if multilingual_data.is_multilingual(s):
        return multilingual_data.check_inputs(s, workdir)
    if storage.is_url(s.data.prepared_dir(workdir)):  # a corpus there already: read in place
        return
    if os.path.exists(os.path.join(s.data.prepared_dir(workdir), corpus.MANIFEST)):
        return
    inputs, _ = s.data.inputs()
    files = [spec for spec in inputs if spec not in NAMED_INPUTS]
    if files:
        sources.resolve_inputs(files)
    if s.data.tokenizer and not os.path.exists(s.data.tokenizer):
        raise UserError(f"tokenizer not found: {s.data.tokenizer}")


def check_existing(s: PretrainSettings, workdir: str, required: Tokenizer | None) -> None:
    """Refuses a prepared corpus whose vocabulary is not the one data.tokenizer names, or whose
    trained size disagrees with a data.vocab_size given on the command line, before anything is
    written. (Every config carries a vocabulary size; one not given on the command line is only a
    default, and the prepared corpus's own vocabulary is used without a word.) A corpus on a
    bucket is checked through the local copy of its tokenizer."""
    prepared = s.data.prepared_dir(workdir)
    if storage.is_url(prepared):
        url = prepared
        prepared = os.path.dirname(transfer.local_copy(storage.join(url, corpus.TOKENIZER_DIR)))
        name_copy(prepared, url)  # a refusal names the corpus's URL, not this host's copy
    if required is not None:
        saved = os.path.join(prepared, corpus.TOKENIZER_DIR)
        if os.path.isdir(saved) and not corpus.same_vocabulary(load_tokenizer(saved), required):
            raise UserError(f"the corpus in {s.data.prepared_dir(workdir)} was tokenized with "
                            "another vocabulary than the init checkpoint's; prepare it with that "
                            "one (a new data.prepared)")
        return
    corpus.check_prepared_matches(
        prepared, tokenizer_spec=s.data.tokenizer,
        vocab_size=s.data.vocab_size if s.data.vocab_size_given else None,
        lowercase=s.data.lowercase)


def batches(s: PretrainSettings, prepared: corpus.PreparedCorpus, *, process_index: int = 0,
            process_count: int = 1) -> PretrainingData:
    """The batch iterator; each process builds its `process_index` row block of every batch."""
    if multilingual_data.is_multilingual(s):
        return multilingual_data.batches(s, prepared, process_index=process_index,
                                         process_count=process_count)
    return PretrainingData(
        prepared, mode=s.objective.mode, masking=s.masking, schedule=s.schedule,
        global_batch_size=s.train.batch_size, seed=s.train.seed,
        process_index=process_index, process_count=process_count,
        short_seq_prob=s.data.short_seq_prob, eval_fraction=s.data.eval_fraction,
        workers=s.data.workers, prefetch=s.data.prefetch,
        read_ahead_steps=s.data.read_ahead_steps, cache_mb=s.data.cache_mb)
