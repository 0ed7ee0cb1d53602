"""Hugging Face ModernBert <-> bertjax: a random ModernBertForMaskedLM (local and global layers,
sequences longer than the window, padding) converted by `python -m bertjax.convert` computes
transformers' MLM scores and hidden states; exported by the library and by `python -m
bertjax.export` it loads into transformers with every weight and computes ours; HF -> bertjax ->
HF is bit-identical; what bertjax cannot compute exactly is refused in one line.

The model side (rotary positions, pre-norm, GeGLU, sliding windows) is test_modern_architecture.py.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import traverse_util
from flax.core import meta
from safetensors.numpy import load_file
from transformers import ModernBertConfig, ModernBertForMaskedLM, ModernBertModel

import bertjax
from bertjax.cli import convert, export
from bertjax.core.errors import UserError
from bertjax.data.schema import zeros_batch
from bertjax.inference import loading
from bertjax.interop import hf_files, hf_models, hf_modernbert
from bertjax.model import layout
from bertjax.model.heads import BertForPretraining
from cli_checks import assert_one_line_error, run_cli

TOL = dict(atol=1e-5, rtol=1e-5)
VOCAB = 200
WORDS = ("the a cat dog sat on mat river bank was muddy after rain paris is capital of france "
         "two men are playing chess in park . ,").split()
TEXTS = ["The cat sat on the mat.", "Two men are playing chess in a park, after the rain.",
         "Paris is the capital of France; the river bank was muddy."]
HF_OPTIONS = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, intermediate_size=48,
                  num_hidden_layers=4, max_position_embeddings=64, local_attention=8,
                  global_attn_every_n_layers=3, pad_token_id=0, cls_token_id=2, sep_token_id=3,
                  bos_token_id=2, eos_token_id=3, attn_implementation="eager")


def vocabulary():
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = list(dict.fromkeys(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters,
                                 *("##" + c for c in letters), *";:!?0123456789"]))
    return tokens + [f"w{i}" for i in range(VOCAB - len(tokens))]


def random_modernbert(biases: bool, seed: int):
    config = ModernBertConfig(**HF_OPTIONS, attention_bias=biases, mlp_bias=biases,
                              classifier_bias=biases, norm_bias=biases)
    model = ModernBertForMaskedLM(config).eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
    return model


def save_hf(directory, model):
    model.save_pretrained(directory)
    with open(os.path.join(directory, hf_files.VOCAB), "w") as f:
        f.writelines(token + "\n" for token in vocabulary())
    return str(directory)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """{biases: (the model, its directory)}: transformers' defaults (no biases) and all biases."""
    root = tmp_path_factory.mktemp("modernbert")
    return {biases: (model, save_hf(root / f"hf_{biases}", model)) for biases in (False, True)
            for model in [random_modernbert(biases, seed=int(biases))]}


def padded_batch(length=30, padding=3, seed=0):
    """Two rows longer than the 8-token window, the second padded (no further than half a window,
    so that every padded query still sees a token in the local layers, as in transformers)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, VOCAB, (2, length)).astype(np.int32)
    ids[:, 0] = 2
    mask = np.ones_like(ids)
    mask[1, length - padding:] = 0
    ids[1, length - padding:] = 0
    return ids, mask


def hf_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask)).logits.numpy()


def our_logits(params, config, ids, mask):
    batch = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
             "masked_positions": np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32),
                                                 ids.shape)}
    forward = jax.jit(lambda p, b: BertForPretraining(config).apply({"params": p}, b))
    return np.asarray(forward(params, {k: jnp.asarray(v) for k, v in batch.items()})[
        "mlm_logits"])


def weights(directory):
    return load_file(os.path.join(directory, hf_files.SAFETENSORS))


def assert_bit_identical(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)), name


@pytest.fixture(scope="module")
def converted(hf_dirs, tmp_path_factory):
    """{(biases, scan): the params export `python -m bertjax.convert` wrote}."""
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for biases, scan in ((False, True), (True, False)):
        target = str(root / f"{biases}_{scan}")
        convert.main(["--from-hf", hf_dirs[biases][1], "--output", target,
                      *([] if scan else ["--no-scan-layers"])])
        out[biases, scan] = target
    return out


@pytest.mark.parametrize("biases,scan", [(False, True), (True, False)])
def test_a_converted_modernbert_computes_transformers_mlm_scores(hf_dirs, converted, biases,
                                                                   scan):
    hf, _ = hf_dirs[biases]
    bundle = loading.load(converted[biases, scan])
    config = bundle.encoder
    assert config.scan_layers == scan and layout.is_scanned(bundle.params["encoder"]) == scan
    assert (config.position_embedding, config.norm, config.mlp) == ("rope", "pre", "geglu")
    assert (config.global_attention_every, config.sliding_window) == (3, 8)
    assert (config.use_bias, config.norm_bias, config.intermediate_size) == (biases, biases, 96)
    ids, mask = padded_batch(seed=int(biases))
    ours, theirs = our_logits(bundle.params, config, ids, mask), hf_logits(hf, ids, mask)
    print(f"max |ours - transformers| MLM logits: {np.abs(ours - theirs).max():.2e}")
    np.testing.assert_allclose(ours, theirs, **TOL)


def test_the_cli_names_what_modernbert_lacks(hf_dirs, tmp_path, capsys):
    code, stdout, err = run_cli(convert, ["--from-hf", hf_dirs[False][1], "--output",
                                          str(tmp_path / "out")], capsys)
    assert code == 0 and "4 layers, hidden 64, 4 heads, vocabulary 200" in stdout, err
    assert "initialized fresh" in err and "the pooler" in err and "MLM" not in err


def test_export_loads_into_transformers_and_round_trips_bit_for_bit(hf_dirs, converted,
                                                                    tmp_path, capsys):
    hf, source = hf_dirs[True]
    out = str(tmp_path / "hf")
    code, stdout, err = run_cli(export, ["--workdir", converted[True, False], "--format", "hf",
                                         "--output", out], capsys)
    assert code == 0 and "wrote the Hugging Face export" in stdout, err
    assert "no ModernBert counterpart" in err
    assert_bit_identical(weights(out), weights(source))
    with open(os.path.join(out, hf_files.CONFIG)) as f:
        config = json.load(f)
    assert config["architectures"] == ["ModernBertForMaskedLM"]
    assert config["layer_types"] == hf.config.layer_types
    assert config["rope_parameters"] == hf.config.rope_parameters
    reloaded, info = ModernBertForMaskedLM.from_pretrained(out, output_loading_info=True,
                                                           attn_implementation="eager")
    assert not any(info.values()), info
    ids, mask = padded_batch(seed=5)
    np.testing.assert_array_equal(hf_logits(reloaded.eval(), ids, mask), hf_logits(hf, ids, mask))


@pytest.fixture(scope="module")
def initialized(hf_dirs):
    """A ModernBERT-style pretraining model of ours, biases included, every value random."""
    config = hf_modernbert.encoder_config_from_hf(hf_dirs[True][0].config.to_dict(),
                                                  scan_layers=True)
    batch = zeros_batch(1, 2, 1, nsp=True, span=False)
    params = meta.unbox(jax.device_get(BertForPretraining(config).init(jax.random.key(3),
                                                                        batch)["params"]))
    return config, jax.tree.map(lambda x: x + np.float32(0.05) * np.random.default_rng(
        x.size).standard_normal(x.shape, np.float32), params)  # scales and biases too


def assert_same_but_what_modernbert_lacks(ours, returned):
    returned = traverse_util.flatten_dict(returned)
    for path, leaf in traverse_util.flatten_dict(ours).items():
        if path[0] == "nsp" or "pooler" in path:
            continue  # no ModernBert counterpart
        if "attention_norm" in path:  # layer 0's is unused, and comes back as the identity's
            identity = np.ones_like if path[-1] == "scale" else np.zeros_like
            np.testing.assert_array_equal(returned[path][0], identity(leaf[0]))
            leaf, returned[path] = leaf[1:], returned[path][1:]
        np.testing.assert_array_equal(returned[path], leaf, err_msg="/".join(path))


@pytest.mark.slow
def test_an_initialized_model_exports_through_the_library(initialized, tmp_path):
    config, params = initialized
    exported = hf_models.to_hf(params, config, {"nsp": True, "sbo": False})
    assert "the pooler, the NSP head: no ModernBert counterpart" in exported.notes[0]
    hf_files.write_model(str(tmp_path), exported.config, exported.state_dict)
    reloaded, info = ModernBertForMaskedLM.from_pretrained(str(tmp_path), output_loading_info=True,
                                                           attn_implementation="eager")
    assert not any(info.values()), info
    ids, mask = padded_batch(seed=7)
    ours, theirs = our_logits(params, config, ids, mask), hf_logits(reloaded.eval(), ids, mask)
    print(f"max |ours - transformers| after export: {np.abs(ours - theirs).max():.2e}")
    np.testing.assert_allclose(ours, theirs, **TOL)
    back = hf_models.from_hf(exported.config, exported.state_dict, scan_layers=True)
    assert back.model == config and hf_modernbert.MLM_PART not in back.initialized
    assert_same_but_what_modernbert_lacks(params, back.params)


def test_an_encoder_alone_is_a_modernbert_model(initialized):
    config, params = initialized
    bare = hf_models.to_hf({"encoder": params["encoder"]}, config, {})
    assert bare.config["architectures"] == ["ModernBertModel"]
    assert not any(name.startswith(("model.", "head.", "decoder.")) for name in bare.state_dict)
    ModernBertModel(ModernBertConfig(**bare.config)).load_state_dict(
        {k: torch.from_numpy(v) for k, v in bare.state_dict.items()})  # strict: every weight
    back = hf_models.from_hf(bare.config, bare.state_dict, scan_layers=False)
    assert hf_modernbert.MLM_PART in back.initialized and "mlm" in back.params
    assert_same_but_what_modernbert_lacks(
        {"encoder": params["encoder"]}, {"encoder": layout.to_scanned(back.params["encoder"])})


@pytest.mark.parametrize("source", ["converted", "hugging face"])
def test_the_api_embeds_text_as_transformers_does(hf_dirs, converted, source):
    """bertjax.load reads a converted directory and a Hugging Face ModernBert one alike."""
    hf, hf_dir = hf_dirs[False]
    model = bertjax.load(converted[False, True] if source == "converted" else hf_dir)
    encoded = model.encode(TEXTS, layers=-1)
    vectors = model.embed(TEXTS, pooling="mean", layers=-1)
    length = max(len(e.ids) for e in encoded)
    assert length > 8
    ids = np.zeros((len(TEXTS), length), np.int64)
    mask = np.zeros_like(ids)
    for row, e in enumerate(encoded):
        ids[row, :len(e.ids)], mask[row, :len(e.ids)] = e.ids, 1
    with torch.no_grad():
        states = hf.model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    states = states.last_hidden_state.numpy()
    means = (states * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    for row, e in enumerate(encoded):
        np.testing.assert_allclose(e.hidden[0], states[row, :len(e.ids)], **TOL)
    print(f"max |embed - transformers mean pool|: {np.abs(vectors - means).max():.2e}")
    np.testing.assert_allclose(vectors, means, **TOL)


REFUSED = [
    ({"hidden_activation": "gelu_new"}, "unsupported hidden_activation 'gelu_new'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                             "rope_theta": 1e4}}}, "rope_type 'linear'"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "unsupported rope_scaling"),
    ({"attention_bias": True}, "one switch for all three"),
    ({"decoder_bias": False}, "decoder_bias"),
    ({"local_attention": 7}, "odd local_attention 7"),
    ({"layer_types": ["sliding_attention", "full_attention", "full_attention",
                      "sliding_attention"]}, "every n-th layer"),
    ({"hidden_size": 60, "num_attention_heads": 4}, "head size 15 is odd"),
    ({"architectures": ["ModernBertForSequenceClassification"]},
     "unsupported architecture ModernBertForSequenceClassification"),
]


@pytest.mark.parametrize("changes,phrase", REFUSED)
def test_what_bertjax_cannot_compute_is_refused_in_one_line(hf_dirs, tmp_path, capsys, changes,
                                                            phrase):
    source = tmp_path / "hf"
    shutil.copytree(hf_dirs[False][1], source)
    with open(source / hf_files.CONFIG) as f:
        config = json.load(f)
    with open(source / hf_files.CONFIG, "w") as f:
        json.dump({**config, **changes}, f)
    out = tmp_path / "out"
    code, _, err = run_cli(convert, ["--from-hf", str(source), "--output", str(out)], capsys)
    assert_one_line_error(code, err, phrase)
    assert not out.exists()


def test_a_fine_tuned_modern_model_is_refused_on_export(hf_dirs):
    config = hf_modernbert.encoder_config_from_hf(hf_dirs[False][0].config.to_dict())
    with pytest.raises(UserError, match="fine-tuned ModernBERT-style"):
        hf_models.to_hf({}, config, {"head": "sequence_classification"})
    with pytest.raises(UserError, match="position_embedding='learned'"):
        hf_modernbert.hf_config_dict(config.replace(position_embedding="learned"), "x")
