"""Multilingual pretraining: smoothed language sampling, one vocabulary, a language per document,
per-language held-out MLM accuracy, and the refusals of bad multilingual configs.

The "languages" are generated: each draws its words from its own made-up vocabulary (disjoint
letters), so a token's language is known from the text alone and nothing is fetched.
"""

import json
import os

import numpy as np
import pytest

import bertjax

from bertjax.core.errors import UserError
from bertjax.data import multilingual_corpus
from bertjax.data.language_sampling import LanguageSampler, smoothed_probabilities
from bertjax.data.length_schedule import LengthSchedule, Phase
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.multilingual_corpus import MultilingualCorpus
from bertjax.data.multilingual_pretraining import MultilingualPretrainingData
from bertjax.data.tokenizer_training import train_wordpiece
from tests import cli_in_process
from tests.pretrain_runs import REPO, run_child, tiny_args

pytestmark = pytest.mark.slow

# Language code: (letters its words are made of, documents). Sizes differ 1 : 4 : 16.
LANGUAGES = {"aa": ("abcdef", 10), "bb": ("ghijkl", 40), "cc": ("mnopqr", 160)}


def write_language(directory, letters, documents, seed):
    """`documents` documents of 3-6 sentences of 4-10 words made of `letters`."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(list(letters), size=rng.integers(2, 6))) for _ in range(60)]
    lines = []
    for _ in range(documents):
        for _ in range(rng.integers(3, 7)):
            lines.append(" ".join(rng.choice(words, size=rng.integers(4, 11))) + " .")
        lines.append("")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "text.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def languages(tmp_path_factory):
    root = tmp_path_factory.mktemp("languages")
    return {code: [write_language(str(root / code), letters, n, seed)]
            for seed, (code, (letters, n)) in enumerate(LANGUAGES.items())}


@pytest.fixture(scope="module")
def prepared(languages, tmp_path_factory):
    sample = multilingual_corpus.vocabulary_sample(languages, "sentences", 0.3, 2000)
    tokenizer = train_wordpiece(sample, vocab_size=400)
    directory = str(tmp_path_factory.mktemp("prepared") / "corpus")
    multilingual_corpus.prepare(languages, "sentences", directory, tokenizer, progress=False)
    return directory


def pretraining_data(directory, seed=0, alpha=0.3, batch=16):
    return MultilingualPretrainingData(
        MultilingualCorpus.open(directory), alpha=alpha, mode="full_sentences",
        masking=MaskingConfig(), schedule=LengthSchedule([Phase(32, 5, 0)]),
        global_batch_size=batch, seed=seed, eval_fraction=0.1, workers=0)


def test_smoothed_probabilities_follow_the_power_law():
    counts = np.array([1000, 100, 10])
    for alpha in (1.0, 0.7, 0.3):
        p = smoothed_probabilities(counts, alpha)
        expected = counts ** alpha / (counts ** alpha).sum()
        np.testing.assert_allclose(p, expected, rtol=1e-12)
    assert smoothed_probabilities(counts, 0.3)[2] > smoothed_probabilities(counts, 0.7)[2]


def test_language_draws_match_the_probabilities_within_binomial_bounds():
    p = smoothed_probabilities(np.array([1000, 100, 10]), 0.3)
    n = 200_000
    drawn = np.bincount(LanguageSampler(p, [7, 0]).languages_of(np.arange(n)), minlength=3)
    bound = 5 * np.sqrt(n * p * (1 - p))  # 5 sigma: a correct sampler fails 1 in ~2 million
    assert np.all(np.abs(drawn - n * p) < bound), (drawn, n * p)


def test_the_vocabulary_sample_is_drawn_with_the_same_smoothing(languages):
    sample = multilingual_corpus.vocabulary_sample(languages, "sentences", 0.3, 10_000)
    read = [sum(1 for line in open(paths[0]) if line.strip()) for paths in languages.values()]
    p = smoothed_probabilities(np.array(read), 0.3)
    by_language = [sum(1 for s in sample if set(s) - set(" .") <= set(letters))
                   for letters, _ in LANGUAGES.values()]
    assert by_language == [round(share * sum(read)) for share in p]
    assert by_language[0] > read[0]  # the smallest language is raised, by repeating it


def test_every_document_keeps_its_language(prepared):
    corpus = MultilingualCorpus.open(prepared)
    assert corpus.languages == list(LANGUAGES)
    assert np.bincount(corpus.document_languages).tolist() == [n for _, n in LANGUAGES.values()]
    tokenizer = corpus.tokenizer
    for document in range(corpus.num_documents):
        letters = LANGUAGES[corpus.languages[corpus.document_languages[document]]][0]
        text = tokenizer.decode(corpus.tokens(*corpus.document_sentences(document)).tolist())
        assert set(text) - set(" .#") <= set(letters), (document, text)


def test_examples_are_drawn_per_language_with_smoothed_probabilities(prepared):
    data = pretraining_data(prepared)
    corpus = data.corpus
    n = 3000
    examples = data.examples(32, 0, n)
    first_sentences = np.array([e.a_sentences[0] for e in examples])
    documents = np.searchsorted(corpus.document_bounds, first_sentences, side="right") - 1
    drawn = np.bincount(corpus.document_languages[documents], minlength=3)
    p = data.probabilities
    assert np.all(np.abs(drawn - n * p) < 5 * np.sqrt(n * p * (1 - p))), (drawn, n * p)
    tokens = corpus.language_tokens()
    assert p[0] > tokens[0] / tokens.sum()  # smoothing raises the smallest language


def test_batches_are_a_function_of_seed_and_step_and_resume_bit_exact(prepared):
    first, again = pretraining_data(prepared), pretraining_data(prepared)
    with first.train_iterator() as it:
        batches = [next(it) for _ in range(6)]
        state = it.get_state()
        following = next(it)
    for step in (0, 5):
        with again.train_iterator(step) as it:
            for key, value in next(it).items():
                np.testing.assert_array_equal(value, batches[step][key])
    with again.train_iterator() as resumed:
        resumed.set_state(state)
        for key, value in next(resumed).items():
            np.testing.assert_array_equal(value, following[key])
    with pretraining_data(prepared, seed=1).train_iterator() as other:
        assert not np.array_equal(next(other)["input_ids"], batches[0]["input_ids"])
    assert state["languages"] == list(LANGUAGES) and state["language_alpha"] == 0.3


def test_worker_processes_build_the_same_batches(prepared):
    """Batches built in spawned workers (the corpus reopened there) equal those built here."""
    data = pretraining_data(prepared)
    with data.train_iterator(3) as here:
        expected = next(here)
    data.workers = 1
    with data.train_iterator(3) as in_worker:
        for key, value in next(in_worker).items():
            np.testing.assert_array_equal(value, expected[key])


def test_held_out_batches_come_per_language(prepared):
    data = pretraining_data(prepared)
    corpus, letters = data.corpus, {c: set(v[0]) for c, v in LANGUAGES.items()}
    by_language = data.eval_batches_by_language(Phase(32, 5, 0), 1)
    assert sorted(by_language) == sorted(LANGUAGES)
    special = set(corpus.tokenizer.special.as_array().tolist())
    for code, (batch,) in by_language.items():
        ids = original_ids(batch)
        real = [int(t) for t in ids[batch["input_mask"].astype(bool)] if int(t) not in special]
        text = corpus.tokenizer.decode(real)
        assert text and set(text) - set(" .#") <= letters[code], (code, text)


def original_ids(batch):
    """The batch's token ids before masking: each prediction slot's original id put back."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return ids


def test_a_tiny_multilingual_run_reports_mlm_accuracy_per_language(languages, tmp_path):
    spec = ",".join(f"{code}={paths[0]}" for code, paths in languages.items())
    workdir = str(tmp_path / "run")
    args = tiny_args(workdir, str(tmp_path / "corpus"), **{
        "data.languages": spec, "data.language_alpha": 0.3, "data.vocab_size": 300,
        "data.eval_fraction": 0.1, "train.steps": 6, "train.eval_every": 6,
        "schedule.long_fraction": 0.0, "train.checkpoint_every": 6})
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    evaluated = {k: v for r in records for k, v in r.items() if k.startswith("eval_mlm_accuracy")}
    for code in LANGUAGES:
        assert 0.0 <= evaluated[f"eval_mlm_accuracy_{code}"] <= 1.0, evaluated
    assert "eval_mlm_accuracy" in evaluated
    model = bertjax.load(workdir)  # the run keeps the shared vocabulary
    assert model.embed(["abc def .", "ghi jkl ."]).shape == (2, 128)


@pytest.mark.parametrize("overrides, message", [
    ({"data.languages": "en"}, "is not CODE=PATH"),
    ({"data.languages": "en={a}"}, "at least two"),
    ({"data.languages": "en={a},es={a}", "data.input": "{a}"}, "not both"),
    ({"data.languages": "en={a},es={a}", "data.language_alpha": 0}, "language_alpha"),
    ({"data.languages": "en={a},es={a}", "data.language_alpha": 1.5}, "language_alpha"),
    ({"data.languages": "en={a},es={missing}"}, "missing"),
])
def test_bad_multilingual_configs_are_refused_before_the_workdir(languages, tmp_path, overrides,
                                                                 message):
    a = languages["aa"][0]
    values = {k: str(v).format(a=a, missing=str(tmp_path / "missing.txt"))
              for k, v in overrides.items()}
    workdir = tmp_path / "run"
    result = cli_in_process.run("main", f"--config={REPO}/configs/tiny.py",
                                f"--workdir={workdir}", "--config.data.workers=0",
                                *[f"--config.{k}={v}" for k, v in values.items()])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertjax: error:") and message in lines[0], \
        result.stderr
    assert not workdir.exists()


def test_a_prepared_corpus_of_other_languages_is_refused(languages, prepared, tmp_path):
    spec = f"aa={languages['aa'][0]},bb={languages['bb'][0]}"  # the corpus holds cc too
    result = cli_in_process.run("main", f"--config={REPO}/configs/tiny.py",
                                f"--workdir={tmp_path / 'run'}", f"--config.data.prepared={prepared}",
                                f"--config.data.languages={spec}")
    assert result.returncode == 2 and "other languages or inputs" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_multilingual_record_that_is_not_one_is_refused(tmp_path):
    (tmp_path / multilingual_corpus.LANGUAGES_FILE).write_text("{}")
    with pytest.raises(UserError, match="is not a"):
        MultilingualCorpus.open(str(tmp_path))
