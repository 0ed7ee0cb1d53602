"""ALBERT runs (configs/albert.py on the tiny model: factorised embeddings, shared layers,
sentence-order prediction) on the machinery every objective uses: a run exports to transformers'
Albert classes with the same scores, resumes exactly after a SIGKILL, steps on a (data, fsdp,
tensor) mesh as on one device, and a fine-tuning run that would re-initialize its top layers is
refused before its workdir exists.
"""

import os
import signal

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from transformers import AlbertForMaskedLM, AlbertForPreTraining

from albert_reference import TOL, hf_outputs, our_outputs, padded_batch
from bertjax.cli import export
from bertjax.inference import loading
from bertjax.model.config import preset
from bertjax.model.heads import BertForPretraining
from bertjax.parallel import partitioning
from bertjax.parallel.mesh import make_mesh
from bertjax.train.metrics_log import read_metrics
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import abstract_train_state, create_train_state
from bertjax.train.step import make_train_step
from bertjax.train.step_timing import TIMING_FIELDS
from cli_checks import assert_one_line_error, run_cli
from pretrain_runs import REPO, SHORT, run_child, tiny_args
from trees import flat

pytestmark = pytest.mark.slow


def albert_args(workdir, corpus_dir):
    args = tiny_args(workdir, corpus_dir, **SHORT)
    args[1] = f"--config={REPO}/configs/albert.py"
    return args + [f"--config.{k}={v}" for k, v in {
        "model.preset": "tiny", "model.embedding_size": 32, "model.max_position_embeddings": 64,
        "data.tokenizer_type": "wordpiece", "optimizer.name": "adamw",
        "optimizer.learning_rate": 1e-3, "optimizer.warmup_steps": 3}.items()]


@pytest.fixture(scope="module")
def albert_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("albert") / "wd")
    done = run_child(albert_args(workdir, small_corpus_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    return workdir


def logged(workdir):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


def test_the_run_trains_sentence_order_and_resumes_exactly_after_sigkill(albert_run, tmp_path,
                                                                         small_corpus_dir):
    metrics = logged(albert_run)
    assert all("nsp_loss" in r and "mlm_loss" in r for r in metrics if "loss" in r)
    resumed = str(tmp_path / "resumed")
    args = albert_args(resumed, small_corpus_dir)
    result = run_child(args, KILL_AFTER_CHECKPOINT=3)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from step 3" in result.stderr
    assert logged(resumed) == metrics
    a, b = flat(loading.load(albert_run).params), flat(loading.load(resumed).params)
    assert a.keys() == b.keys() and any("shared_layer" in k for k in a)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_trained_albert_exports_to_transformers_albert_classes(tmp_path, capsys, albert_run):
    out = str(tmp_path / "hf")
    code, _, err = run_cli(export, ["--workdir", albert_run, "--format", "hf", "--output", out],
                           capsys)
    assert code == 0, err
    bundle = loading.load(albert_run)
    assert bundle.encoder.share_layers and bundle.encoder.embedding_size == 32
    batch = padded_batch(bundle.encoder.vocab_size, 3)
    _, heads = our_outputs(bundle.params, bundle.encoder, batch)
    pretraining, info = AlbertForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"], info
    theirs = hf_outputs(pretraining.eval(), batch)
    np.testing.assert_allclose(heads["mlm_logits"], theirs.prediction_logits.numpy(), **TOL)
    np.testing.assert_allclose(heads["nsp_logits"], theirs.sop_logits.numpy(), **TOL)
    masked_lm, info = AlbertForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"], info
    logits = hf_outputs(masked_lm.eval(), batch).logits.numpy()
    np.testing.assert_allclose(heads["mlm_logits"], logits, **TOL)




def test_reinitializing_top_layers_of_a_shared_checkpoint_is_refused(tmp_path, albert_run):
    workdir = tmp_path / "wd"
    done = run_child(["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
                      f"--workdir={workdir}", f"--config.init_checkpoint={albert_run}",
                      "--config.model.preset=from_checkpoint",
                      "--config.finetune.reinit_top_layers=1",
                      "--config.data.train=a.jsonl", "--config.data.eval=b.jsonl"])
    assert_one_line_error(done.returncode, done.stderr, "so no top layer can be re-initialized")
    assert not os.path.exists(workdir)




def test_a_sharded_step_equals_the_one_device_step():
    """Shared layers under nn.scan on a (2, 2, 2) mesh: the one layer's parameters are sharded
    by the rules (no layer axis) and two steps give the one-device losses and parameters."""
    config = preset("tiny", vocab_size=512, num_heads=8, max_position_embeddings=64,
                    scan_layers=True, embedding_size=32, share_layers=True,
                    activation="gelu_tanh", hidden_dropout=0.1)
    model = BertForPretraining(config)
    rng = np.random.default_rng(0)
    batch = padded_batch(512, 0)
    batch.update(masked_positions=rng.integers(1, 7, (3, 4)).astype(np.int32),
                 masked_ids=rng.integers(5, 512, (3, 4)).astype(np.int32),
                 masked_weights=np.ones((3, 4), np.float32),
                 nsp_label=np.array([0, 1, 0], np.int32))
    batch = {k: np.concatenate([v] * 4) for k, v in batch.items()}  # 12 rows: data x fsdp = 4
    optimizer = make_optimizer(OptimizerConfig(learning_rate=2e-3, warmup_steps=0,
                                               total_steps=100))
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    runs = {}
    for name, mesh in (("one", make_mesh(1, 1, 1, devices=jax.devices()[:1])),
                       ("mesh", make_mesh(2, 2, 2))):
        if name == "one":
            state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=0)
            start = jax.device_get(state)
        else:
            _, shardings = abstract_train_state(model, optimizer, shapes, mesh, seed=0)
            state = jax.device_put(start, shardings)
        global_batch = partitioning.global_batch(batch, mesh)
        step = make_train_step(model, optimizer, mesh, shardings)
        losses = []
        for _ in range(2):
            state, metrics = step(state, global_batch)
            losses.append(float(metrics["loss"]))
        runs[name] = losses, jax.device_get(state.params), state.params
    np.testing.assert_allclose(runs["mesh"][0], runs["one"][0], rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), runs["mesh"][1],
                 runs["one"][1])
    kernel = runs["mesh"][2]["encoder"]["shared_layer"]["intermediate"]["kernel"]
    assert kernel.shape == (128, 512) and kernel.sharding.spec == P("fsdp", "tensor")
    assert all(shard.data.shape == (64, 256) for shard in kernel.addressable_shards)
