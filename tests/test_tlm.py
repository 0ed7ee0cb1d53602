"""XLM's translation language modelling: translation pairs in one row, masked on both sides,
positions restarting at the second sentence, a language id per side; mixed with MLM in the stated
share; refused without parallel text.

Two generated "languages" (disjoint letters) and a word-for-word "translation" between them, so
each side's language is readable from its tokens; the Debian Bibles are fetched only by the
system_packages test.
"""

import json
import os

import numpy as np
import pytest

from bertjax.data import multilingual_corpus, parallel_text
from bertjax.data.length_schedule import LengthSchedule, Phase
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.multilingual_corpus import MultilingualCorpus
from bertjax.data.multilingual_pretraining import MultilingualPretrainingData
from bertjax.data.parallel_text import ParallelPairs
from bertjax.data.tokenizer_training import train_wordpiece
from tests import cli_in_process
from tests.pretrain_runs import REPO, run_child, tiny_args

pytestmark = pytest.mark.slow

LETTERS = {"aa": "abcdef", "bb": "ghijkl"}
PHASE = Phase(48, 8, 0)


def lexicons(seed=0):
    rng = np.random.default_rng(seed)
    return {code: ["".join(rng.choice(list(letters), size=rng.integers(2, 6))) for _ in range(50)]
            for code, letters in LETTERS.items()}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return write_texts(tmp_path_factory.mktemp("tlm"))


def write_texts(root) -> dict:
    """Monolingual files per language and a file of 300 aa-bb translation pairs."""
    words, rng = lexicons(), np.random.default_rng(1)
    files = {}
    for code in LETTERS:
        lines = []
        for _ in range(40):
            lines += [" ".join(rng.choice(words[code], size=rng.integers(4, 10))) + " ."
                      for _ in range(rng.integers(3, 6))] + [""]
        files[code] = str(root / f"{code}.txt")
        with open(files[code], "w") as f:
            f.write("\n".join(lines))
    pairs = []
    for _ in range(300):
        chosen = rng.integers(0, 50, size=rng.integers(4, 10))
        pairs.append(" ".join(words["aa"][i] for i in chosen) + "\t"
                     + " ".join(words["bb"][i] for i in chosen))
    files["pairs"] = str(root / "pairs.tsv")
    with open(files["pairs"], "w") as f:
        f.write("\n".join(pairs) + "\n")
    return files


@pytest.fixture(scope="module")
def prepared(texts, tmp_path_factory):
    languages = {code: [texts[code]] for code in LETTERS}
    tokenizer = train_wordpiece(
        multilingual_corpus.vocabulary_sample(languages, "sentences", 0.5, 1000), vocab_size=300)
    directory = str(tmp_path_factory.mktemp("prepared") / "corpus")
    multilingual_corpus.prepare(languages, "sentences", directory, tokenizer, progress=False)
    parallel_text.prepare_pairs(texts["pairs"], "aa", "bb", directory, tokenizer)
    return directory


def tlm_data(directory, fraction=0.5, seed=0):
    return MultilingualPretrainingData(
        MultilingualCorpus.open(directory), alpha=0.5, mode="documents",
        parallel=ParallelPairs(parallel_text.pairs_path(directory, "aa", "bb"), "aa", "bb"),
        tlm_fraction=fraction, masking=MaskingConfig(), schedule=LengthSchedule([PHASE]),
        global_batch_size=64, seed=seed, eval_fraction=0.1, workers=0)


def side_letters(tokenizer, ids):
    text = tokenizer.decode([int(i) for i in ids])
    return set(text) - set(" .#")


def test_tlm_rows_hold_a_pair_masked_on_both_sides_with_positions_and_languages(prepared):
    data = tlm_data(prepared)
    builder, tokenizer = data._train, data.corpus.tokenizer
    batch = builder.build(PHASE, 0, 64)
    tlm_rows = np.flatnonzero(builder.is_tlm(np.arange(64)))
    assert 10 < tlm_rows.size < 54
    masked_sides = np.zeros(2, int)
    for row in tlm_rows:
        length = int(batch["input_mask"][row].sum())
        segments, positions = batch["segment_ids"][row, :length], batch["positions"][row, :length]
        second = int(np.flatnonzero(np.diff(segments))[0]) + 1  # B starts where the language does
        assert positions[0] == 0 and positions[second] == 0, positions
        np.testing.assert_array_equal(positions[:second], np.arange(second))
        np.testing.assert_array_equal(positions[second:], np.arange(length - second))
        assert set(segments[:second]) | set(segments[second:]) == {0, 1}
        assert len(set(segments[:second])) == 1 and len(set(segments[second:])) == 1
        assert batch["pack_ids"][row, :length].tolist() == [1] * length  # the sides see each other
        original = original_ids(batch, row)[:length]
        assert original[second - 1] == tokenizer.special.sep
        for side, ids, language in ((0, original[1:second - 1], segments[0]),
                                    (1, original[second:-1], segments[second])):
            assert side_letters(tokenizer, ids) <= set(LETTERS[["aa", "bb"][language]])
        slots = batch["masked_weights"][row] > 0
        where = batch["masked_positions"][row][slots]
        masked_sides += [(where < second).sum(), (where >= second).sum()]
    assert masked_sides.min() > 0.3 * masked_sides.sum() / 2, masked_sides  # both sides masked


def test_monolingual_rows_carry_their_language_id(prepared):
    data = tlm_data(prepared)
    batch = data._train.build(PHASE, 0, 64)
    tokenizer = data.corpus.tokenizer
    special = set(tokenizer.special.as_array().tolist())
    for row in np.flatnonzero(~data._train.is_tlm(np.arange(64))):
        length = int(batch["input_mask"][row].sum())
        (language,) = set(batch["segment_ids"][row, :length].tolist())
        ids = [i for i in original_ids(batch, row)[:length] if int(i) not in special]
        assert side_letters(tokenizer, ids) <= set(LETTERS[["aa", "bb"][language]])


def test_the_tlm_share_matches_the_fraction_within_binomial_bounds(prepared):
    n, fraction = 20_000, 0.3
    drawn = int(tlm_data(prepared, fraction)._train.is_tlm(np.arange(n)).sum())
    assert abs(drawn - n * fraction) < 5 * np.sqrt(n * fraction * (1 - fraction))


def test_tlm_batches_are_a_function_of_seed_and_step(prepared):
    with tlm_data(prepared).train_iterator() as first:
        batches = [next(first) for _ in range(3)]
        state = first.get_state()
        following = next(first)
    with tlm_data(prepared).train_iterator() as resumed:
        resumed.set_state(state)
        for key, value in next(resumed).items():
            np.testing.assert_array_equal(value, following[key])
    with tlm_data(prepared).train_iterator(2) as again:
        for key, value in next(again).items():
            np.testing.assert_array_equal(value, batches[2][key])
    assert state["tlm_fraction"] == 0.5 and state["parallel_pairs"] == 300
    in_worker = tlm_data(prepared)
    in_worker.workers = 1  # the builder pickled into a spawned process
    with in_worker.train_iterator(2) as again:
        for key, value in next(again).items():
            np.testing.assert_array_equal(value, batches[2][key])


def original_ids(batch, row):
    ids = batch["input_ids"][row].copy()
    slots = batch["masked_weights"][row] > 0
    ids[batch["masked_positions"][row][slots]] = batch["masked_ids"][row][slots]
    return ids


def tlm_overrides(texts, **more):
    return {"objective": "roberta", "data.separate_documents": "true",
            "data.languages": f"aa={texts['aa']},bb={texts['bb']}", "data.tlm_fraction": 0.5,
            "data.parallel": f"aa-bb={texts['pairs']}", "data.vocab_size": 300,
            "data.eval_fraction": 0.1, **more}


def test_a_tiny_tlm_run_trains_and_reports_each_language(texts, tmp_path):
    workdir = str(tmp_path / "run")
    args = tiny_args(workdir, str(tmp_path / "corpus"), **tlm_overrides(texts, **{
        "train.steps": 4, "train.eval_every": 4, "schedule.long_fraction": 0.0,
        "train.checkpoint_every": 4}))
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "0.5 of the rows translation pairs (300 aa-bb pairs)" in result.stderr
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        keys = {k for line in f for k in json.loads(line)}
    assert {"eval_mlm_accuracy_aa", "eval_mlm_accuracy_bb", "mlm_loss"} <= keys


@pytest.mark.parametrize("change, message", [
    ({"data.parallel": ""}, "needs parallel text"),
    ({"data.languages": ""}, "needs data.languages"),
    ({"data.separate_documents": "false"}, "separate_documents"),
    ({"model.type_vocab_size": 1}, "type_vocab_size"),
    ({"data.parallel": "aa-cc={pairs}"}, "not one of data.languages"),
    ({"data.parallel": "aa-bb={bad}"}, "not a pair"),
    ({"data.tlm_fraction": 0, "data.parallel": "aa-bb={pairs}"}, "tlm_fraction > 0"),
    ({"data.tlm_fraction": 1.0}, "tlm_fraction must be in"),
])
def test_bad_tlm_configs_are_refused_in_one_line_before_the_workdir(texts, tmp_path, change,
                                                                    message):
    bad = tmp_path / "bad.tsv"
    bad.write_text("only one side\n")
    values = tlm_overrides(texts, **{k: str(v).format(pairs=texts["pairs"], bad=bad)
                                     for k, v in change.items()})
    workdir = tmp_path / "run"
    result = cli_in_process.run("main", f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}",
                                *[f"--config.{k}={v}" for k, v in values.items()])
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertjax: error:") and message in lines[0], \
        result.stderr
    assert not workdir.exists()


@pytest.mark.system_packages
def test_the_bible_verse_pairs_align_english_with_spanish(tmp_path):
    output = str(tmp_path / "pairs.tsv")
    result = cli_in_process.run("bertjax.data.parallel_text", "--output", output,
                                "--texts", str(tmp_path / "texts"))
    assert result.returncode == 0, result.stderr
    for code, first in (("en", "In the beginning God"), ("es", "EN el principio")):
        assert (tmp_path / "texts" / f"{code}.txt").read_text().startswith(first)
    pairs = parallel_text.read_pairs(output)
    assert len(pairs) > 30_000
    assert pairs[0] == ("In the beginning God created the heaven and the earth.",
                        "EN el principio crió Dios los cielos y la tierra.")
    assert pairs[-1][1].startswith("La gracia de nuestro Señor Jesucristo")
