"""Where fine-tuning starts: only the encoder of a pretraining checkpoint is loaded (heads dropped,
the new head fresh), the top k layers can be re-initialized in either layer layout, a frozen
encoder never moves, and a vocabulary that does not fit the checkpoint is refused."""

import os

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from bertjax.cli import main
from bertjax.data.tokenizer import load_tokenizer
from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.jobs.starting_point import starting_point
from bertjax.settings import finetune as finetune_settings
from bertjax.train import freezing, warm_start
from bertjax.interop import hf_bert_config, hf_layout, params_dir
from bertjax.model.config import EncoderConfig, preset
from bertjax.model.heads import BertForPretraining
from bertjax.model.task_heads import SequenceClassifier, SpanExtractor, TokenClassifier
from bertjax.parallel import partitioning
from bertjax.parallel.mesh import make_mesh
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import create_train_state
from bertjax.train.step import make_train_step
from mesh_batches import batch_shapes
from trees import flat

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(num_layers=3, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=40,
             hidden_dropout=0.0, attention_dropout=0.0)


def load_encoder(directory, params, shardings, reinit_top_layers, num_layers):
    return warm_start.load_encoder(directory, loading.load(directory).params, params, shardings,
                                   reinit_top_layers, num_layers)


@pytest.fixture(scope="module")
def pretrained_export(tmp_path_factory):
    """A pretraining model's parameters (encoder, MLM, NSP) in per-layer layout, as an export."""
    config = preset("tiny", **SMALL, scan_layers=False)
    model = BertForPretraining(config)
    batch = {"input_ids": np.zeros((1, 8), np.int32), "segment_ids": np.zeros((1, 8), np.int32),
             "input_mask": np.ones((1, 8), np.int32),
             "masked_positions": np.zeros((1, 2), np.int32)}
    variables = model.init({"params": jax.random.PRNGKey(7)}, batch, deterministic=True)
    params = jax.tree.map(np.asarray, jax.device_get(nn.meta.unbox(variables["params"])))
    directory = str(tmp_path_factory.mktemp("export") / "pretrained")
    params_dir.save(directory, params, config, heads={"nsp": True, "sbo": False})
    return directory, params


@pytest.mark.slow
def test_only_the_encoder_is_loaded_and_the_top_layers_can_start_fresh(pretrained_export):
    directory, source = pretrained_export
    mesh = make_mesh()
    config = EncoderConfig(**{**SMALL, "scan_layers": True})  # stacked: loads across layouts
    model = SequenceClassifier(config, 3)
    optimizer = make_optimizer(OptimizerConfig(total_steps=10, warmup_steps=1))
    state, shardings = create_train_state(model, optimizer, batch_shapes(mesh), mesh, seed=1)
    fresh = flat(jax.device_get(state.params))
    loaded = flat(jax.device_get(load_encoder(directory, state.params, shardings.params, 0, config.num_layers)))
    assert set(loaded) == set(fresh)  # no mlm/nsp arrays came along
    np.testing.assert_array_equal(loaded["encoder/layers/attention/query/kernel"][2],
                                  source["encoder"]["layer_2"]["attention"]["query"]["kernel"])
    np.testing.assert_array_equal(loaded["encoder/pooler/kernel"],
                                  source["encoder"]["pooler"]["kernel"])
    np.testing.assert_array_equal(loaded["classifier/kernel"], fresh["classifier/kernel"])

    top = flat(jax.device_get(load_encoder(directory, state.params, shardings.params, 1, config.num_layers)))
    for name, value in top.items():
        if name.startswith("encoder/layers/"):
            np.testing.assert_array_equal(value[:2], loaded[name][:2], err_msg=name)
            np.testing.assert_array_equal(value[2], fresh[name][2], err_msg=name)
        elif name.startswith("encoder/pooler/"):
            np.testing.assert_array_equal(value, fresh[name])
        else:
            np.testing.assert_array_equal(value, loaded[name])
    with pytest.raises(UserError, match="exceeds the encoder's 3 layers"):
        load_encoder(directory, state.params, shardings.params, 4, 3)


def test_a_pooler_never_trained_starts_fresh_for_the_task_head(pretrained_export, capsys):
    """RoBERTa / SpanBERT pretraining has no NSP, so nothing trained the pooler: the classifier
    gets a fresh one (RoBERTa's choice), and says so."""
    assert warm_start.pooler_was_trained({"nsp": True, "sbo": False})
    assert not warm_start.pooler_was_trained({"nsp": False, "sbo": True})
    assert not warm_start.pooler_was_trained({"nsp": True, "pooler_trained": False})
    assert not warm_start.pooler_was_trained({"nsp": True},
                                             ["the pooler (bert.pooler)"])  # an import without
    directory, source = pretrained_export
    mesh = make_mesh()
    config = EncoderConfig(**{**SMALL, "scan_layers": True})
    model = SequenceClassifier(config, 2)
    optimizer = make_optimizer(OptimizerConfig(total_steps=10, warmup_steps=1))
    state, shardings = create_train_state(model, optimizer, batch_shapes(mesh), mesh, seed=1)
    fresh = flat(jax.device_get(state.params))
    loaded = flat(jax.device_get(warm_start.load_encoder(
        directory, loading.load(directory).params, state.params, shardings.params, 0,
        config.num_layers, trained_pooler=False)))
    np.testing.assert_array_equal(loaded["encoder/pooler/kernel"], fresh["encoder/pooler/kernel"])
    np.testing.assert_array_equal(loaded["encoder/layers/output/kernel"][1],
                                  source["encoder"]["layer_1"]["output"]["kernel"])
    assert "pooler of" in capsys.readouterr().err


@pytest.mark.slow
def test_reinitializing_per_layer_parameters(pretrained_export):
    directory, source = pretrained_export
    mesh = make_mesh()
    config = EncoderConfig(**{**SMALL, "scan_layers": False})
    model = SpanExtractor(config)
    shapes = batch_shapes(mesh, context_mask=np.int32)
    shapes["context_mask"] = shapes["input_ids"]
    optimizer = make_optimizer(OptimizerConfig(total_steps=10, warmup_steps=1))
    state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=1)
    fresh = flat(jax.device_get(state.params))
    top = flat(jax.device_get(load_encoder(directory, state.params, shardings.params, 2, config.num_layers)))
    np.testing.assert_array_equal(top["encoder/layer_0/output/kernel"],
                                  source["encoder"]["layer_0"]["output"]["kernel"])
    for layer in (1, 2):
        np.testing.assert_array_equal(top[f"encoder/layer_{layer}/output/kernel"],
                                      fresh[f"encoder/layer_{layer}/output/kernel"])
    assert top["qa_outputs/kernel"].shape == (32, 2)


@pytest.mark.slow
def test_a_frozen_encoder_does_not_move(pretrained_export):
    mesh = make_mesh()
    config = EncoderConfig(**{**SMALL, "scan_layers": True, "hidden_dropout": 0.1})
    model = TokenClassifier(config, 3, use_crf=True, freeze_encoder=True)
    shapes = batch_shapes(mesh)
    shapes.update(label_ids=shapes["input_ids"], label_mask=shapes["input_ids"])
    del shapes["label"]
    optimizer = freezing.freeze_encoder(make_optimizer(OptimizerConfig(
        total_steps=10, warmup_steps=0, weight_decay=0.1)))
    state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=0)
    before = flat(jax.device_get(state.params))
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 40, (8, 8)), "segment_ids": np.zeros((8, 8)),
             "input_mask": np.ones((8, 8)), "label_ids": rng.integers(0, 3, (8, 8)),
             "label_mask": np.ones((8, 8)), "weight": np.ones(8)}
    batch = {k: v.astype(shapes[k].dtype) for k, v in batch.items()}
    from bertjax.finetune import objectives

    step = make_train_step(model, optimizer, mesh, shardings, objective=objectives.CRF_TAGGING)
    for _ in range(2):
        state, metrics = step(state, partitioning.global_batch(batch, mesh))
        jax.block_until_ready(metrics)
    after = flat(jax.device_get(state.params))
    for name in before:
        if name.startswith("encoder/"):
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert not np.array_equal(after["classifier/kernel"], before["classifier/kernel"])
    assert not np.array_equal(after["crf/transitions"], before["crf/transitions"])
    assert np.isfinite(float(metrics["loss"]))


def test_an_imported_bert_is_refused_with_another_vocabulary(tmp_path, minilm_dir, capsys):
    """A converted Hugging Face BERT (the first MiniLM layer) and a 5-token vocabulary: exit 2."""
    import json

    from safetensors.numpy import load_file

    with open(os.path.join(minilm_dir, "config.json")) as f:
        config = hf_bert_config.encoder_config_from_hf(json.load(f), num_layers=1)
    params, _, _ = hf_layout.from_hf_state_dict(
        load_file(os.path.join(minilm_dir, "model.safetensors")), config)
    export = str(tmp_path / "minilm")
    params_dir.save(export, params, config, heads={"nsp": True},
                    tokenizer=load_tokenizer(os.path.join(minilm_dir, "vocab.txt")))
    other = tmp_path / "other"
    other.mkdir()
    (other / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nmovie\n")
    workdir = str(tmp_path / "wd")
    code = main.main(["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
                      f"--workdir={workdir}", f"--config.init_checkpoint={export}",
                      f"--config.data.tokenizer={other}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "vocabulary mismatch" in err[0] and "6 tokens" in err[0] and "30522" in err[0]
    assert not os.path.exists(workdir)  # refused before anything was written
    # With its own vocabulary the same export is accepted (tokenizer from the export).
    from configs import finetune_sentiment

    config = finetune_sentiment.get_config()
    config.init_checkpoint = export
    begun = starting_point(finetune_settings.read(config, require_data=False))
    assert begun.encoder.vocab_size == begun.tokenizer.vocab_size == 30522
    assert begun.encoder.num_layers == 1 and begun.encoder.hidden_size == 384


def test_freeze_wrapper_keeps_the_optimizer_state_param_shaped():
    params = {"encoder": {"w": np.ones(3, np.float32)}, "classifier": {"kernel": np.ones(2)}}
    optimizer = freezing.freeze_encoder(optax.sgd(0.1))
    state = optimizer.init(params)
    updates, _ = optimizer.update({"encoder": {"w": np.ones(3)},
                                   "classifier": {"kernel": np.ones(2)}}, state, params)
    np.testing.assert_array_equal(updates["encoder"]["w"], 0.0)
    np.testing.assert_allclose(updates["classifier"]["kernel"], -0.1)


@pytest.mark.slow
def test_a_crf_tagger_fits_real_tweets():
    """The token-classification head with its CRF loss learns real BIO tags: 32 tweets of the
    packaged NER set, fitted by a one-layer model and scored by entity F1 through the task's own
    evaluation (Viterbi decoding)."""
    from bertjax.data.tokenizer_training import train_wordpiece
    from bertjax.finetune import readers
    from bertjax.finetune.tasks import TaskSettings, task_class
    from bertjax.train.step import make_predict_step

    tweets = readers.read(readers.Source("packaged:tweet_ner:train"), "tagged")[:32]
    tokenizer = train_wordpiece([" ".join(t.words) for t in tweets], vocab_size=600,
                                lowercase=False)
    cls = task_class("finetune_token_classification")
    settings = TaskSettings(max_seq_len=64, crf=True)
    task = cls(settings, cls.labels_from(tweets, settings))
    features = task.featurize(tokenizer, tweets, "tweets", training=True)
    config = EncoderConfig(vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=64,
                           num_heads=2, intermediate_size=128, hidden_dropout=0.0,
                           attention_dropout=0.0, scan_layers=True)
    model = task.model(config, False)
    mesh = make_mesh()
    optimizer = make_optimizer(OptimizerConfig(learning_rate=3e-3, total_steps=100,
                                               warmup_steps=0, decay="constant",
                                               bias_correction=True))
    sharding = partitioning.batch_sharding(mesh)
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding)
              for k, v in features.arrays.items()}
    state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=0)
    step = make_train_step(model, optimizer, mesh, shardings, objective=task.objective)
    batch = partitioning.global_batch(features.arrays, mesh)
    for _ in range(60):
        state, metrics = step(state, batch)
        # One step in flight at a time: many queued steps with cross-device collectives can
        # starve the CPU backend's 8 host devices on 2 cores.
        jax.block_until_ready(metrics)
    outputs = jax.device_get(make_predict_step(model, mesh, shardings)(state.params, batch))
    scores = task.evaluate(tweets, features, {"tags": np.asarray(outputs["tags"])})
    assert scores["entity_f1"] > 0.5, scores  # all-O scores 0
