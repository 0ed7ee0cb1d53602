"""The pretraining job's multilingual data (data.languages): each language prepared under one
vocabulary trained on a smoothed sample of all of them, and batches mixing the languages."""

from __future__ import annotations

import os
import sys

from bertjax.data import multilingual_corpus, parallel_text, tokenizer_training
from bertjax.data.corpus import same_vocabulary
from bertjax.data.multilingual_corpus import MultilingualCorpus
from bertjax.data.multilingual_pretraining import MultilingualPretrainingData
from bertjax.data.parallel_text import ParallelPairs
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.core.errors import UserError
from bertjax.settings.pretrain import PretrainSettings

VOCABULARY_SAMPLE_SENTENCES = 1_000_000  # sentences the vocabulary is trained on, all languages


def is_multilingual(s: PretrainSettings) -> bool:
    """data.languages, or TLM (which asks for them in `check_inputs`)."""
    return bool(s.data.languages.strip()) or bool(s.data.tlm_fraction)


def check_inputs(s: PretrainSettings, workdir: str) -> None:
    """Every language's inputs exist, unless the corpus is prepared already."""
    if s.data.tlm_fraction:
        s.data.parallel_spec()  # TLM without parallel text or languages: refused first
    directory = s.data.prepared_dir(workdir)
    languages = multilingual_corpus.parse_languages(s.data.languages)
    if multilingual_corpus.is_prepared(directory):
        prepared = {e["code"]: e["inputs"] for e in
                    multilingual_corpus.read_languages(directory)["languages"]}
        if prepared != languages:
            raise UserError(f"{directory} holds a multilingual corpus of other languages or "
                            f"inputs ({', '.join(prepared)}) than data.languages; nothing was "
                            "changed: prepare into another data.prepared")
        return
    multilingual_corpus.check_inputs(languages)
    if s.data.tlm_fraction:
        parallel_text.read_pairs(s.data.parallel_spec()[2])
    if s.data.tokenizer and not os.path.exists(s.data.tokenizer):
        raise UserError(f"tokenizer not found: {s.data.tokenizer}")


def prepared_corpus(s: PretrainSettings, workdir: str, required: Tokenizer | None, *,
                    may_prepare: bool = True) -> MultilingualCorpus:
    d = s.data
    directory = d.prepared_dir(workdir)
    if not multilingual_corpus.is_prepared(directory):
        if not may_prepare:
            raise UserError(f"the prepared corpus {directory} is missing on this host although "
                            "process 0 has it: with several hosts, the workdir (or "
                            "data.prepared) must be on a file system every host shares")
        languages = multilingual_corpus.parse_languages(d.languages)
        tokenizer = required or (load_tokenizer(d.tokenizer, lowercase=d.lowercase)
                                 if d.tokenizer else train_vocabulary(s, languages))
        multilingual_corpus.prepare(languages, d.input_format, directory, tokenizer,
                                    workers=max(1, os.cpu_count() or 1))
    prepared = MultilingualCorpus.open(directory)
    if d.tlm_fraction and may_prepare:
        a, b, path = d.parallel_spec()
        parallel_text.prepare_pairs(path, a, b, directory, prepared.tokenizer)
    if required is not None and not same_vocabulary(prepared.tokenizer, required):
        raise UserError(f"the corpus in {directory} was tokenized with another vocabulary than "
                        "the init checkpoint's; prepare it with that one (a new data.prepared)")
    return prepared


def train_vocabulary(s: PretrainSettings, languages: dict[str, list[str]]) -> Tokenizer:
    """One vocabulary for all languages, trained on a sample drawn with data.language_alpha."""
    d = s.data
    sample = multilingual_corpus.vocabulary_sample(languages, d.input_format, d.language_alpha,
                                                   VOCABULARY_SAMPLE_SENTENCES)
    train = {"wordpiece": tokenizer_training.train_wordpiece,
             "sentencepiece": tokenizer_training.train_sentencepiece,
             "bpe": tokenizer_training.train_bpe}[d.tokenizer_type]
    return train(sample, vocab_size=d.vocab_size, lowercase=d.lowercase)


def batches(s: PretrainSettings, prepared: MultilingualCorpus, *, process_index: int = 0,
            process_count: int = 1) -> MultilingualPretrainingData:
    parallel = None
    if s.data.tlm_fraction:
        a, b, _ = s.data.parallel_spec()
        parallel = ParallelPairs(parallel_text.pairs_path(prepared.root, a, b), a, b)
    data = MultilingualPretrainingData(
        prepared, alpha=s.data.language_alpha, parallel=parallel,
        tlm_fraction=s.data.tlm_fraction, mode=s.objective.mode, masking=s.masking,
        schedule=s.schedule, global_batch_size=s.train.batch_size, seed=s.train.seed,
        process_index=process_index, process_count=process_count,
        short_seq_prob=s.data.short_seq_prob, eval_fraction=s.data.eval_fraction,
        workers=s.data.workers, prefetch=s.data.prefetch)
    if process_index == 0:
        tlm = (f"; {s.data.tlm_fraction:g} of the rows translation pairs ({len(parallel)} "
               f"{parallel.a}-{parallel.b} pairs)" if parallel is not None else "")
        print("languages (sampling probability p_l ~ token share^"
              f"{s.data.language_alpha:g}):\n" + multilingual_corpus.summary(
                  multilingual_corpus.read_languages(prepared.root), data.probabilities) + tlm,
              file=sys.stderr)
    return data
