"""The TFDS builders tests/test_tfds.py prepares locally (array_record, no download)."""

import numpy as np
import tensorflow_datasets as tfds


class BertjaxTinyText(tfds.core.GeneratorBasedBuilder):
    """A two-split text dataset built locally in array_record format (no download)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"title": tfds.features.Text(), "text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(4), "test": self._generate_examples(1)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"title": f"t{i}", "text": f"Doc {i} opens. Dr. Who is here.\n\nIts end {i}."}


class BertjaxTinyGlue(tfds.core.GeneratorBasedBuilder):
    """A GLUE-shaped dataset: sentence, ClassLabel label, idx; test labels are -1 as in GLUE."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "sentence": tfds.features.Text(), "idx": np.int32,
            "label": tfds.features.ClassLabel(names=["negative", "positive"])}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(False), "test": self._generate_examples(True)}

    def _generate_examples(self, unlabeled):
        for i, (text, label) in enumerate([("good movie", 1), ("bad movie", 0)]):
            yield i, {"sentence": text, "idx": i, "label": -1 if unlabeled else label}


class BertjaxTinyMrpc(tfds.core.GeneratorBasedBuilder):
    """MRPC's class names, not in sorted order: not_equivalent (0), equivalent (1)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "sentence1": tfds.features.Text(), "sentence2": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=["not_equivalent", "equivalent"])}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i, (a, b, label) in enumerate([("a", "a", 1), ("a", "b", 0), ("b", "b", 1)]):
            yield i, {"sentence1": a, "sentence2": b, "label": label}
