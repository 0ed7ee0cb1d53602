"""The multilingual keys of the data section (data.languages, language_alpha, parallel,
tlm_fraction): checked with the rest of the settings, before anything is written."""

from __future__ import annotations

from bertjax.core.errors import UserError
from bertjax.data.language_sampling import check_alpha
from bertjax.data.multilingual_corpus import parse_languages
from bertjax.data.parallel_text import parse_parallel
from bertjax.settings.config_keys import Section


def check_corpus(data) -> None:
    """`data`: the CorpusSettings being built. What can be checked in the config itself; the
    parallel text and the languages a config leaves for the command line are asked for by
    `parallel_spec` when the job starts, as data.input is."""
    check_alpha(data.language_alpha)
    if data.languages.strip():
        parse_languages(data.languages)
        if data.input.strip():
            raise UserError("set data.input or data.languages, not both (data.languages names "
                            "each language's inputs)")
    if not 0.0 <= data.tlm_fraction < 1.0:
        raise UserError(f"data.tlm_fraction must be in [0, 1), got {data.tlm_fraction}")
    if not data.tlm_fraction:
        if data.parallel.strip():
            raise UserError("data.parallel is read only for translation language modelling: "
                            "set data.tlm_fraction > 0 too")
        return
    if not data.separate_documents:
        raise UserError("translation language modelling needs data.separate_documents=true "
                        "(rows carry positions, which restart at a pair's second sentence)")
    if data.parallel.strip() and data.languages.strip():
        parallel_spec(data)


def parallel_spec(data) -> tuple[str, str, str]:
    """(language A, language B, path) of the parallel text TLM reads."""
    if not data.parallel.strip():
        raise UserError("translation language modelling (data.tlm_fraction > 0) needs parallel "
                        "text: set data.parallel=A-B=PATH (tab-separated pairs)")
    if not data.languages.strip():
        raise UserError("translation language modelling needs data.languages (the monolingual "
                        "text of each language)")
    a, b, path = parse_parallel(data.parallel)
    missing = [c for c in (a, b) if c not in parse_languages(data.languages)]
    if missing:
        raise UserError(f"data.parallel is in {', '.join(missing)}, not one of data.languages")
    return a, b, path


def check_language_ids(config: Section, model) -> None:
    """With translation language modelling the segment table is the language embedding."""
    if not config.data.tlm_fraction or not config.data.languages.strip() \
            or model.from_checkpoint:
        return
    languages = len(parse_languages(config.data.languages))
    if model.type_vocab_size < languages:
        raise UserError(f"translation language modelling embeds each token's language in the "
                        f"segment table: model.type_vocab_size must be at least the {languages} "
                        f"languages, got {model.type_vocab_size}")
