"""The Python API checks its arguments before it reads or runs anything: a wrong type is a
TypeError, a bad value a UserError, each naming the function and the argument; a lone string
where a list of texts belongs is refused everywhere (fill_mask's one `text` excepted); empty lists
give empty results; a [MASK] cut off by max_seq_len is counted, not dropped."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.core.errors import UserError
from bertjax.model.task_heads import SequenceClassifier
from bertjax.parallel.mesh import make_mesh
from saved_runs import random_params, save_workdir
# test_api.py's tiny pretrained workdir (3 layers, hidden 32, 64 positions), not a second copy.
from saved_runs import api_config as config

HIDDEN, POSITIONS = 32, 64


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory, tokenizer_dir):
    """A fine-tuned sentence classifier's workdir (random weights), for predict."""
    batch = {k: jnp.zeros((1, 4), jnp.int32) for k in ("input_ids", "segment_ids", "input_mask")}
    params = random_params(SequenceClassifier(config(True), num_labels=2), (batch,), 5)
    workdir = save_workdir(str(tmp_path_factory.mktemp("classifier") / "wd"), params,
                           config(True), task="finetune_classification",
                           heads={"labels": ["neg", "pos"]}, tokenizer_dir=tokenizer_dir)
    # Trained on rows within the model's 64 positions (the default settings' 128 would not fit).
    record_path = os.path.join(workdir, "run.json")
    with open(record_path) as f:
        record = json.load(f)
    with open(record_path, "w") as f:
        json.dump({**record, "task_settings": {"max_seq_len": 32}}, f)
    return workdir


@pytest.fixture(scope="module")
def models(pretrained, classifier_dir):
    workdir, _ = pretrained
    return {"pretrained": bertjax.load(workdir), "classifier": bertjax.load(classifier_dir),
            "workdir": workdir}


def _load(**options):
    return lambda m: bertjax.load(m["workdir"], **options)


def _on(model: str, method: str, *args, **kwargs):
    return lambda m: getattr(m[model], method)(*args, **kwargs)


def _pre(method, *args, **kwargs):
    return _on("pretrained", method, *args, **kwargs)


# (case id, the call, the exception, a phrase its message must contain)
BAD_ARGUMENTS = [
    ("embed-none", _pre("embed", None), TypeError,
     "embed: texts must be a list of texts (strings), got NoneType"),
    ("embed-ints", _pre("embed", [1, 2]), TypeError, "embed: texts[0] must be a string, got int"),
    ("embed-dict", _pre("embed", {"a": 1}), TypeError, "embed: texts must be a list"),
    ("embed-pooling", _pre("embed", ["a"], pooling="median"), UserError,
     "embed: unknown pooling 'median'; choose one of cls, mean"),
    ("embed-pooling-type", _pre("embed", ["a"], pooling=None), TypeError,
     "embed: pooling must be one of"),
    ("embed-normalize", _pre("embed", ["a"], normalize="yes"), TypeError,
     "embed: normalize must be True or False, got 'yes'"),
    ("embed-no-layers", _pre("embed", ["a"], layers=[]), UserError,
     "embed: layers: choose at least one layer"),
    ("embed-bool-layer", _pre("embed", ["a"], layers=True), TypeError,
     "embed: layers must be 'all', an index or a list of indices, got bool"),
    ("embed-float-layer", _pre("embed", ["a"], layers=[0, 1.5]), TypeError,
     "got 1.5 (float)"),
    ("embed-pairs-count", _pre("embed", ["a"], pairs=["x", "y"]), UserError,
     "embed: pairs must be as many as the texts: 1 texts but 2 pairs"),
    ("embed-standardize", _pre("embed", ["a"], standardize=3), TypeError,
     "embed: standardize must be a path"),
    ("encode-layer-high", _pre("encode", ["a"], layers=4), UserError,
     "encode: layer 4 does not exist"),
    ("encode-layer-low", _pre("encode", ["a"], layers=-5), UserError, "layer -5 does not exist"),
    ("encode-layer-name", _pre("encode", ["a"], layers="last"), UserError,
     "encode: layers='last'"),
    ("encode-pairs-count", _pre("encode", ["a", "b"], pairs=["x"]), UserError,
     "2 texts but 1 pairs"),
    ("encode-pairs-string", _pre("encode", ["a"], pairs="x"), TypeError,
     "encode: pairs must be a list of texts"),
    ("similarity-string", _pre("similarity", "a cat", ["a dog"]), TypeError,
     "similarity: a must be a list of texts"),
    ("similarity-none-item", _pre("similarity", ["a"], [None]), TypeError,
     "similarity: b[0] must be a string, got NoneType"),
    ("similarity-pooling", _pre("similarity", ["a"], ["b"], pooling="avg"), UserError,
     "similarity: unknown pooling 'avg'"),
    ("words-string-sentence", _pre("word_vectors", ["the bank"]), TypeError,
     "word_vectors: sentences[0] must be a list of words, got the string 'the bank'"),
    ("words-string", _pre("word_vectors", "the bank"), TypeError,
     "word_vectors: sentences must be a list of sentences"),
    ("words-int-word", _pre("word_vectors", [["the", 3]]), TypeError,
     "word_vectors: sentences[0][1] must be a string, got int"),
    ("words-blank-word", _pre("word_vectors", [["the", " "]]), UserError,
     "word_vectors: sentences[0][1] is a blank word"),
    ("words-layer", _pre("word_vectors", [["the"]], layers=9), UserError,
     "word_vectors: layer 9 does not exist"),
    ("fill-no-mask", _pre("fill_mask", "no mask here"), UserError,
     "fill_mask: text has no [MASK] to fill: 'no mask here'"),
    ("fill-no-mask-in-list", _pre("fill_mask", ["a [MASK]", "none"]), UserError,
     "fill_mask: text[1] has no [MASK]"),
    ("fill-none", _pre("fill_mask", None), TypeError,
     "fill_mask: text must be a string or a list of strings, got NoneType"),
    ("fill-top-k-zero", _pre("fill_mask", "a [MASK]", top_k=0), UserError,
     "fill_mask: top_k must be an integer of at least 1, got 0"),
    ("fill-top-k-negative", _pre("fill_mask", "a [MASK]", top_k=-3), UserError,
     "fill_mask: top_k must be an integer of at least 1, got -3"),
    ("fill-top-k-float", _pre("fill_mask", "a [MASK]", top_k=2.0), TypeError,
     "fill_mask: top_k must be an integer of at least 1, got 2.0"),
    ("fill-top-k-inf", _pre("fill_mask", "a [MASK]", top_k=float("inf")), TypeError,
     "top_k must be an integer of at least 1, got inf"),
    ("fill-top-k-bool", _pre("fill_mask", "a [MASK]", top_k=True), TypeError,
     "top_k must be an integer of at least 1, got True"),
    ("fill-fine-tuned", _on("classifier", "fill_mask", "a [MASK]"), UserError,
     "has no pretrained MLM head"),
    ("predict-string", _on("classifier", "predict", "a great film"), TypeError,
     "predict: texts must be a list of texts (strings), got one string 'a great film'"),
    ("predict-none-item", _on("classifier", "predict", [None]), TypeError,
     "predict: texts[0] must be a string, got NoneType"),
    ("predict-pairs-count", _on("classifier", "predict", ["a", "b"], pairs=["x"]), UserError,
     "predict: pairs must be as many as the texts: 2 texts but 1 pairs"),
    ("predict-pretrained", _pre("predict", ["a"]), UserError, "is not a fine-tuned run"),
    ("load-batch-size-string", _load(batch_size="8"), TypeError,
     "load: batch_size must be an integer of at least 1, got '8'"),
    ("load-batch-size-zero", _load(batch_size=0), UserError,
     "load: batch_size must be an integer of at least 1, got 0"),
    ("load-step-negative", _load(step=-1), UserError,
     "load: step must be an integer of at least 0"),
    ("load-step-nan", _load(step=float("nan")), TypeError,
     "load: step must be an integer of at least 0 (or None), got nan"),
    ("load-mesh", _load(mesh="cpu"), TypeError, "load: mesh must be a jax.sharding.Mesh"),
    ("load-max-seq-len", _load(max_seq_len=2), UserError,
     "load: max_seq_len must be an integer of at least 3"),
    ("load-dtype", _load(dtype="float64"), UserError, "load: unknown dtype 'float64'"),
    ("load-base", _load(base=5), TypeError, "load: base must be a path"),
    ("load-path-none", lambda m: bertjax.load(None), TypeError, "load: path must be a path"),
    ("load-path-empty", lambda m: bertjax.load(""), UserError, "load: path is empty"),
]


@pytest.mark.parametrize("call, error, phrase", [case[1:] for case in BAD_ARGUMENTS],
                         ids=[case[0] for case in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_before_anything_runs(models, call, error, phrase):
    compiled = {name: set(models[name]._compiled) for name in ("pretrained", "classifier")}
    with pytest.raises(error) as raised:
        call(models)
    assert phrase in str(raised.value)
    # Wrong types are UserErrors too: a command line reports them as one line.
    assert isinstance(raised.value, UserError)
    assert {name: set(models[name]._compiled) for name in compiled} == compiled


@pytest.mark.parametrize("call", [
    _pre("embed", "a text"), _pre("encode", "a text"), _pre("similarity", ["a"], "a text"),
    _pre("word_vectors", "a text"), _pre("embed", ["a"], pairs="a text"),
    _on("classifier", "predict", "a text")],
    ids=["embed", "encode", "similarity", "word_vectors", "pairs", "predict"])
def test_a_lone_string_is_refused_wherever_a_list_of_texts_belongs(models, call):
    with pytest.raises(TypeError) as raised:
        call(models)
    assert "got one string 'a text'; for one item, pass ['a text']" in str(raised.value)


@pytest.mark.slow
def test_a_list_of_one_text_is_one_result_and_fill_mask_takes_one_text(models):
    model = models["pretrained"]
    assert model.embed(["a great film"]).shape == (1, HIDDEN)
    assert len(model.encode(["a great film"])) == 1
    assert model.word_vectors([["a", "great", "film"]])[0].shape == (3, HIDDEN)
    assert len(models["classifier"].predict(["a great film"])) == 1
    one = model.fill_mask("a great [MASK]", top_k=2)
    assert len(one) == 1 and len(one[0]) == 2
    assert model.fill_mask(["a great [MASK]"], top_k=2) == [one]


def test_empty_lists_give_empty_results(models):
    model = models["pretrained"]
    assert model.encode([]) == []
    assert model.embed([]).shape == (0, HIDDEN)
    assert model.similarity([], ["a"]).shape == (0, 1)
    assert model.word_vectors([]) == []
    assert model.fill_mask([]) == []
    assert models["classifier"].predict([]) == []


def test_masks_past_max_seq_len_are_counted_not_dropped(models, capsys):
    model = models["pretrained"]
    before = model.truncated
    found = model.fill_mask("[MASK] " * 600, top_k=1)
    kept = POSITIONS - 2  # [CLS] and [SEP]
    assert len(found) == 600
    assert all(len(predictions) == 1 for predictions in found[:kept])
    assert found[kept:] == [[]] * (600 - kept)
    assert model.truncated == before + 1
    assert f"{600 - kept} [MASK](s) past it get no predictions" in capsys.readouterr().err


def test_a_mesh_is_accepted(models):
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert bertjax.load(models["workdir"], mesh=mesh, batch_size=np.int64(2)).batch_size == 2


def test_a_model_without_a_vocabulary_says_how_to_give_it_one(tmp_path, pretrained):
    """The advice names what a user of the API (or embed, index, wsd) can do: --tokenizer and
    --config.data.tokenizer belong to export and fine-tuning, not to bertjax.load."""
    _, params = pretrained
    workdir = save_workdir(str(tmp_path / "wd"), params, config(True), task="pretrain",
                           heads={"nsp": True, "sbo": False}, tokenizer_dir="")
    with pytest.raises(UserError, match="keeps no tokenizer.*python -m bertjax.export "
                                        f"--workdir {workdir} --format params --tokenizer VOCAB"):
        bertjax.load(workdir)
