"""TFDS data sets, built locally in array_record format and read without TensorFlow: as a
pretraining source, as prepared shards and as fine-tuning data (the tfds extra)."""

import dataclasses
import os
import sys

import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.preparation_engine import prepare
from bertjax.data.tokenizer import WordPieceTokenizer
from bertjax.data.sources import SourceStats, iter_documents
from bertjax.finetune import features, readers
from bertjax.finetune.readers import Source
from bertjax.finetune.tasks import task_class
from bertjax.jobs import task_data
from bertjax.settings import finetune as finetune_settings

pytestmark = pytest.mark.tfds


@pytest.fixture(scope="module")
def builders():
    # The tfds extra, imported here: the fast tier does not install it.
    import tfds_builders
    return tfds_builders


@pytest.fixture(scope="module")
def bert(bert_vocab_path):
    return WordPieceTokenizer.from_vocab_file(bert_vocab_path)


# --- TFDS, without TensorFlow --------------------------------------------------------------------

def test_tfds_local_dataset_without_tensorflow(builders, tmp_path):
    data_dir = str(tmp_path / "tfds")
    builders.BertjaxTinyText(data_dir=data_dir, file_format="array_record").download_and_prepare()
    stats = SourceStats()
    documents = list(iter_documents(["tfds:bertjax_tiny_text"], "sentences", stats=stats,
                                    tfds_data_dir=data_dir))
    assert sorted(documents) == [[f"Doc {i} opens.", "Dr. Who is here.", f"Its end {i}."]
                                 for i in range(4)]
    assert documents == list(iter_documents(["tfds:bertjax_tiny_text:train"], "sentences",
                                            tfds_data_dir=data_dir))  # deterministic order
    test_split = list(iter_documents(["tfds:bertjax_tiny_text:1.0.0:test"], "sentences",
                                     tfds_data_dir=data_dir))
    assert test_split == [["Doc 0 opens.", "Dr. Who is here.", "Its end 0."]]
    titles = list(iter_documents(["tfds:bertjax_tiny_text:test"], "sentences",
                                 tfds_data_dir=data_dir, tfds_text_feature="title"))
    assert titles == [["t0"]]
    assert (stats.documents, stats.sentences) == (4, 12)
    assert "tensorflow" not in sys.modules
    with pytest.raises(UserError, match="no feature 'body'"):
        list(iter_documents(["tfds:bertjax_tiny_text"], "sentences", tfds_data_dir=data_dir,
                            tfds_text_feature="body"))
    with pytest.raises(UserError, match="cannot open TFDS dataset"):
        list(iter_documents(["tfds:bertjax_no_such_dataset"], "sentences", tfds_data_dir=data_dir))


# --- TFDS (GLUE-like, array_record, no TensorFlow) -----------------------------------------------

def test_tfds_glue_like_dataset_reads_class_names(builders, tmp_path):
    data_dir = str(tmp_path / "tfds")
    builders.BertjaxTinyGlue(data_dir=data_dir, file_format="array_record").download_and_prepare()
    source = Source("tfds:bertjax_tiny_glue:train", tfds_data_dir=data_dir)
    examples = readers.read(source, "text")
    assert sorted((e.text, e.label) for e in examples) == [("bad movie", "negative"),
                                                           ("good movie", "positive")]
    with pytest.raises(UserError, match="the label is missing"):  # GLUE's unlabeled test split
        readers.read(Source("tfds:bertjax_tiny_glue:test", tfds_data_dir=data_dir), "text")
    with pytest.raises(UserError, match="tfds build glue/sst2"):
        readers.read(Source("tfds:glue/sst2:train", tfds_data_dir=data_dir), "text")


def _pair_config(**overrides):
    from configs import finetune_pair

    config = finetune_pair.get_config()
    config.data.update({"text_column": "sentence1", "text_pair_column": "sentence2",
                        "label_column": "label", "labels": "", **overrides})
    return config


def test_tfds_class_names_keep_their_order_and_f1_is_of_the_positive_label(builders, tmp_path):
    data_dir = str(tmp_path / "tfds")
    builders.BertjaxTinyMrpc(data_dir=data_dir, file_format="array_record").download_and_prepare()
    config = _pair_config(train="tfds:bertjax_tiny_mrpc:train", eval="x", tfds_data_dir=data_dir)
    s = finetune_settings.read(config)
    cls = task_class("finetune_classification")
    task_settings = task_data.declared_labels(s, cls)
    assert task_settings.labels == ("not_equivalent", "equivalent")  # not sorted
    examples = readers.read(s.data.source(s.data.train, labeled=True, regression=False), "text")
    task = cls(task_settings, cls.labels_from(examples, task_settings))
    gold = np.array([1, 1, 0, 0])  # equivalent, equivalent, not, not
    outputs = {"logits": np.eye(2)[[1, 0, 0, 0]]}  # one equivalent found, none wrongly
    feats = features.Features({"label": gold, "weight": np.ones(4, np.float32)})
    assert task.evaluate([], feats, outputs)["f1"] == pytest.approx(2 / 3)  # F1 of equivalent
    negative = cls(dataclasses.replace(task_settings, positive_label="not_equivalent"),
                   task.labels)
    assert negative.evaluate([], feats, outputs)["f1"] == pytest.approx(0.8)
    with pytest.raises(UserError, match="data.positive_label 'yes' is not a label"):
        cls.labels_from(examples, dataclasses.replace(task_settings, positive_label="yes"))
    with pytest.raises(UserError, match="data.positive_label '2' is not one of data.labels"):
        finetune_settings.read(_pair_config(labels="0,1", positive_label="2"), require_data=False)
    # Files keep sorting (no declared order).
    assert readers.label_order(Source(str(tmp_path / "any.tsv"))) == ()


# --- prepared shards ------------------------------------------------------------------------------

def test_prepare_a_tfds_dataset(builders, bert, tmp_path):
    tfds = builders.tfds

    class BertjaxPrepareText(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(3):
                yield i, {"text": f"Article {i} starts here. It has two sentences."}

    data_dir = str(tmp_path / "tfds")
    BertjaxPrepareText(data_dir=data_dir, file_format="array_record").download_and_prepare()
    out = str(tmp_path / "prepared")
    manifest = prepare(["tfds:bertjax_prepare_text"], "sentences", out, bert, workers=1,
                       progress=False, tfds_data_dir=data_dir)
    assert (manifest["documents"], manifest["sentences"]) == (3, 6)
    assert manifest["plan"]["inputs"] == [{"tfds": "tfds:bertjax_prepare_text",
                                           "data_dir": os.path.abspath(data_dir)}]
    prepared = PreparedCorpus.open(out)
    np.testing.assert_array_equal(prepared.tokens(1, 2), bert.encode("It has two sentences."))
