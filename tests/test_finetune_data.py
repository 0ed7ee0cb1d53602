"""Fine-tuning readers and features: named-column tables, CoNLL, SQuAD,
the packaged real datasets and their split, subword label alignment and QA windows; bad input is
a UserError naming the file."""

import json

import numpy as np
import pytest

from bertjax.data.tokenizer import WordPieceTokenizer
from bertjax.core.errors import UserError
from bertjax.finetune import batches, features, readers
from bertjax.finetune.packaged import datasets
from bertjax.finetune.examples import QAExample, TaggedExample, TextExample
from bertjax.finetune.readers import Columns, Source
from bertjax.finetune.tasks import TaskSettings, task_class

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "new", "york", "times", "is",
         "a", "paper", "in", "city", "##s", "play", "##ing", "when", "was", "it", "founded",
         "1851", ".", "?", ",", "by", "raymond", "good", "bad", "movie"]


@pytest.fixture(scope="module")
def tokenizer():
    return WordPieceTokenizer(VOCAB)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return str(path)


# --- tables --------------------------------------------------------------------------------------

def test_glue_tsv_csv_and_jsonl_with_named_columns(tmp_path):
    tsv = write(tmp_path / "mrpc.tsv", "Quality\t#1 ID\t#1 String\t#2 String\n"
                '1\t7\tHe said "yes\tShe said no\n0\t8\tA\tB\n')
    columns = Columns(text="#1 String", text_pair="#2 String", label="Quality", id="#1 ID")
    examples = readers.read(Source(tsv, columns=columns), "text")
    assert examples == [TextExample("7", 'He said "yes', "She said no", "1"),
                        TextExample("8", "A", "B", "0")]
    csv_path = write(tmp_path / "d.csv", 'text,label\n"good, really",pos\nbad,neg\n')
    assert [(e.text, e.label) for e in readers.read(
        Source(csv_path, columns=Columns(text="text")), "text")] == [("good, really", "pos"),
                                                                      ("bad", "neg")]
    jsonl = write(tmp_path / "d.jsonl", '{"t": "x", "score": 2.5}\n\n{"t": "y", "score": -1}\n')
    examples = readers.read(Source(jsonl, columns=Columns(text="t", label="score"),
                                   regression=True), "text")
    assert [(e.id, e.label) for e in examples] == [("1", 2.5), ("3", -1.0)]


@pytest.mark.parametrize("content, columns, message", [
    ("sentence\tlabel\nhello\t1\n", Columns(text="text"), "no column 'text'"),
    ("sentence\tlabel\nhello\t\n", Columns(), "the label is missing"),
    ("sentence\tlabel\n", Columns(), "no examples in"),
    ("sentence\tlabel\nhello\t1\textra\n", Columns(), "3 fields, the header has 2"),
])
def test_bad_tables_are_refused_by_line(tmp_path, content, columns, message):
    path = write(tmp_path / "bad.tsv", content)
    with pytest.raises(UserError, match=message):
        readers.read(Source(path, columns=columns), "text")


def test_regression_labels_must_be_numbers_and_missing_files_are_named(tmp_path):
    path = write(tmp_path / "r.tsv", "sentence\tlabel\nhello\thigh\n")
    with pytest.raises(UserError, match=r"r.tsv:2: the label 'high' is not a number"):
        readers.read(Source(path, regression=True), "text")
    with pytest.raises(UserError, match="data file not found"):
        readers.read(Source(str(tmp_path / "nope.tsv")), "text")
    # Prediction inputs may lack the label column.
    unlabeled = write(tmp_path / "u.tsv", "sentence\nhello\n")
    assert readers.read(Source(unlabeled, labeled=False), "text")[0].label is None


def test_a_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    path = tmp_path / "mrpc.tsv"  # GLUE's MRPC TSVs start with one
    path.write_bytes("Quality\t#1 String\n1\thello\n".encode("utf-8-sig"))
    examples = readers.read(Source(str(path), columns=Columns(text="#1 String", label="Quality")),
                            "text")
    assert [(e.text, e.label) for e in examples] == [("hello", "1")]
    conll = tmp_path / "d.conll"
    conll.write_bytes("EU\tB-ORG\n".encode("utf-8-sig"))
    assert readers.read(Source(str(conll)), "tagged")[0].words == ["EU"]


# --- CoNLL and SQuAD -----------------------------------------------------------------------------

def test_conll_tab_or_space_separated_with_docstart(tmp_path):
    path = write(tmp_path / "d.conll", "-DOCSTART- -X- O O\n\nEU NNP B-ORG\nrejects VBZ O\n"
                 " \t \nNew\tB-LOC\nYork\tI-LOC\n")
    examples = readers.read(Source(path), "tagged")
    assert [(e.words, e.tags) for e in examples] == [(["EU", "rejects"], ["B-ORG", "O"]),
                                                     (["New", "York"], ["B-LOC", "I-LOC"])]
    bad = write(tmp_path / "bad.conll", "EU\tB-ORG\nrejects\n")
    with pytest.raises(UserError, match=r"bad.conll:2: .*the tag is missing"):
        readers.read(Source(bad), "tagged")


def test_squad_reader_and_bad_squad(tmp_path):
    qa = {"id": "a", "question": "When?", "answers": [{"text": "1851", "answer_start": 18}]}
    paragraph = {"context": "It was founded in 1851.", "qas": [qa]}
    document = {"data": [{"title": "t", "paragraphs": [paragraph]}]}
    path = write(tmp_path / "s.json", json.dumps(document))
    [example] = readers.read(Source(path), "qa")
    assert example.answers == [("1851", 18)] and example.question == "When?"
    broken = write(tmp_path / "b.json", '{"data": [{"title": "t"}]}')
    with pytest.raises(UserError, match="not SQuAD v1.1 JSON"):
        readers.read(Source(broken), "qa")


# --- packaged real datasets ----------------------------------------------------------------------

def test_packaged_datasets_split_deterministically_and_disjointly():
    splits = {s: readers.read(Source(f"packaged:movie_reviews:{s}"), "text")
              for s in datasets.SPLITS}
    texts = {s: {e.text for e in examples} for s, examples in splits.items()}
    assert sum(len(e) for e in splits.values()) == 10_605 - 37  # scores of exactly 0 skipped
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"]
    assert 0.75 < len(splits["train"]) / 10_568 < 0.85
    assert {e.label for e in splits["dev"]} == {"positive", "negative"}
    scores = readers.read(Source("packaged:movie_review_scores:dev"), "text")
    assert all(isinstance(e.label, float) and -4 <= e.label <= 4 for e in scores)
    tweets = [t for s in datasets.SPLITS
              for t in readers.read(Source(f"packaged:tweet_ner:{s}"), "tagged")]
    assert len(tweets) == 2394
    assert len({t[2:] for e in tweets for t in e.tags if t != "O"}) == 10
    assert datasets.split_of("a sentence") == datasets.split_of("a sentence")
    with pytest.raises(UserError, match="the split must be one of"):
        readers.read(Source("packaged:tweet_ner:validation"), "tagged")


def test_a_damaged_packaged_file_is_refused_by_line(tmp_path):
    path = write(tmp_path / "reviews.txt", "1\t1.5\tgood\r\n2\thigh\tbad\r\n")
    with pytest.raises(UserError, match=r"reviews.txt:2: the score 'high' is not a number"):
        datasets.movie_reviews(path, regression=True)


# --- features ------------------------------------------------------------------------------------

def test_pair_features_truncate_the_longer_side_with_segment_ids(tokenizer):
    example = TextExample("1", "the new york times is a paper", "in the city", "1")
    f = features.encode_sentences(tokenizer, [example], 10, np.array([1]))
    ids = f.arrays["input_ids"][0]
    # budget 7: a (7 tokens) loses 3, b (3 tokens) keeps 3 -> 4 + 3 (longest first, BERT's way)
    assert tokenizer.tokens(ids) == ["[CLS]", "the", "new", "york", "times", "[SEP]", "in", "the",
                                     "city", "[SEP]"]
    assert f.arrays["segment_ids"][0].tolist() == [0] * 6 + [1] * 4
    assert f.arrays["input_mask"][0].sum() == 10 and f.counts["example(s) truncated to "
                                                            "max_seq_len"] == 1


@pytest.mark.parametrize("all_subwords", [True, False])
def test_word_labels_expand_to_subwords_and_are_read_from_the_first(tokenizer, all_subwords):
    example = TaggedExample("1", ["playing", "new", "york"], ["B-ACT", "B-LOC", "I-LOC"])
    tags = {"O": 0, "B-ACT": 1, "I-ACT": 2, "B-LOC": 3, "I-LOC": 4}
    f = features.encode_tagged(tokenizer, [example], 8, tags, all_subwords)
    assert tokenizer.tokens(f.arrays["input_ids"][0][:6]) == [
        "[CLS]", "play", "##ing", "new", "york", "[SEP]"]
    # B-ACT continues as I-ACT on "##ing"; first-subword mode leaves it out of the loss.
    assert f.arrays["label_ids"][0][:6].tolist() == [0, 1, 2, 3, 4, 0]
    assert f.arrays["label_mask"][0][:6].tolist() == [0, 1, int(all_subwords), 1, 1, 0]
    assert f.word_starts[0].tolist() == [1, 3, 4]
    cut = features.encode_tagged(tokenizer, [example], 4, tags, all_subwords)
    assert cut.word_starts[0].tolist() == [1] and sum(cut.counts.values()) == 2


def test_words_after_a_word_that_does_not_fit_are_cut_too(tokenizer):
    """A shorter word after a cut one is not squeezed in: predictions stay on their words."""
    example = TaggedExample("1", ["a", "playingss", "the"], ["B-X", "O", "B-X"])
    assert [len(p) for p in tokenizer.encode_batch(example.words)] == [1, 4, 1]
    cls = task_class("finetune_token_classification")
    task = cls(TaskSettings(max_seq_len=8), ["O", "B-X", "I-X"])
    f = features.encode_tagged(tokenizer, [example], 5, {"O": 0, "B-X": 1, "I-X": 2}, True)
    assert f.word_starts[0].tolist() == [1]  # "the" would fit after [CLS] a, but is cut
    assert f.counts["word(s) cut by max_seq_len (predicted O)"] == 2
    assert tokenizer.tokens(f.arrays["input_ids"][0][:3]) == ["[CLS]", "a", "[SEP]"]
    predicted = np.array([[0, 1, 1, 0, 0]])  # B-X at "a" (and junk at [SEP])
    assert task.word_tags([example], f, {"tags": predicted}) == [["B-X", "O", "O"]]


def test_data_labels_need_the_i_tag_of_every_b_tag():
    cls = task_class("finetune_token_classification")
    train = [TaggedExample("1", ["new", "york"], ["B-LOC", "O"])]
    with pytest.raises(UserError, match="data.labels lacks 'I-LOC': every B-TYPE needs its I-TYPE"):
        cls.labels_from(train, TaskSettings(labels=("O", "B-LOC")))
    assert cls.labels_from(train, TaskSettings(labels=("O", "B-LOC", "I-LOC"))) == [
        "O", "B-LOC", "I-LOC"]


def test_unseen_and_non_bio_labels_are_refused(tokenizer):
    cls = task_class("finetune_token_classification")
    train = [TaggedExample("1", ["new", "york"], ["B-LOC", "I-LOC"])]
    task = cls(TaskSettings(), cls.labels_from(train, TaskSettings()))
    assert task.labels == ["O", "B-LOC", "I-LOC"]
    with pytest.raises(UserError, match="dev.conll: label.*'B-PER'.*not seen in training"):
        task.featurize(tokenizer, [TaggedExample("2", ["raymond"], ["B-PER"])], "dev.conll",
                       training=False)
    with pytest.raises(UserError, match="not BIO"):
        cls.labels_from([TaggedExample("1", ["york"], ["LOC"])], TaskSettings())
    classifier = task_class("finetune_classification")
    with pytest.raises(UserError, match="at least two"):
        classifier.labels_from([TextExample("1", "a", None, "x")], TaskSettings())


def _qa(context, answer, start, qid="q"):
    return QAExample(qid, "when was it founded ?", context, [(answer, start)])


def test_qa_windows_keep_the_answer_and_map_back_to_the_text(tokenizer):
    context = "The New York Times is a paper, founded in 1851 by Raymond. " * 3
    example = _qa(context, "1851", context.index("1851"))
    settings = features.QASettings(max_seq_len=24, doc_stride=6, max_query_length=8,
                                   training=True)
    f = features.encode_qa(tokenizer, [example], settings)
    assert len(f) >= 1 and f.counts["window(s) without the whole answer, not trained on"] > 0
    for row in range(len(f)):
        start, end = f.arrays["start_positions"][row], f.arrays["end_positions"][row]
        assert tokenizer.id_to_token(int(f.arrays["input_ids"][row][start])) == "1851"
        words = f.windows.token_word[row]
        offsets = f.windows.word_offsets[0]
        assert context[offsets[words[start]][0]:offsets[words[end]][1]] == "1851"
        assert f.arrays["context_mask"][row][start] == 1
    evaluation = features.encode_qa(tokenizer, [example], features.QASettings(
        max_seq_len=24, doc_stride=6, max_query_length=8))
    assert len(evaluation) > len(f)  # every window is kept for prediction
    # Each context token is judged in exactly one window (its maximal context).
    first_word = {}
    for row in range(len(evaluation)):
        for position in np.flatnonzero(evaluation.windows.max_context[row]):
            word = evaluation.windows.token_word[row][position]
            first_word[word] = first_word.get(word, 0) + 1
    assert set(first_word.values()) == {1}


def test_qa_training_rows_skip_the_max_context_search(tokenizer, monkeypatch):
    context = "The New York Times is a paper, founded in 1851 by Raymond. " * 3
    example = _qa(context, "1851", context.index("1851"))

    def unused(*args):
        raise AssertionError("max context computed for a training row")

    monkeypatch.setattr(features, "_max_context_row", unused)
    f = features.encode_qa(tokenizer, [example], features.QASettings(
        max_seq_len=24, doc_stride=6, max_query_length=8, training=True))
    assert len(f) >= 1 and not f.windows.max_context.any()
    assert f.windows.max_context.shape == f.arrays["input_ids"].shape


def test_qa_answer_not_in_its_context_is_a_counted_skip(tokenizer):
    good = _qa("founded in 1851 .", "1851", 11, "a")
    moved = _qa("founded in 1851 .", "1851", 3, "b")  # wrong offset
    absent = _qa("founded in 1851 .", "1900", 11, "c")
    f = features.encode_qa(tokenizer, [good, moved, absent], features.QASettings(
        max_seq_len=24, doc_stride=8, max_query_length=8, training=True))
    assert len(f) == 1
    assert f.counts["example(s) skipped: the answer is not at its offset in the context"] == 2


def test_a_batch_that_does_not_split_over_processes_is_a_user_error():
    arrays = {"weight": np.ones(4, np.float32)}
    with pytest.raises(UserError, match="train.batch_size 3 does not split over 2 processes"):
        batches.EpochBatches(arrays, 3, 0, process_index=0, process_count=2)


def test_doc_windows_cover_everything_with_the_stride():
    assert features.doc_windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert features.doc_windows(3, 4, 2) == [(0, 3)]
    assert features.doc_windows(0, 4, 2) == [(0, 0)]
