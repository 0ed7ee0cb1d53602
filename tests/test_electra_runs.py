"""ELECTRA pretraining end to end on real text (tiny sizes): the metrics it logs, exact resume after
SIGKILL across the 32 -> 64 token switch, the Hugging Face export of the run, and fine-tuning
starting from its discriminator."""

import json
import os
import signal

import jax
import numpy as np
import pytest
import torch
from transformers import ElectraForMaskedLM, ElectraForPreTraining

from bertjax.cli import export

from bertjax.inference import loading
from bertjax.model.electra import DiscriminatorHead, ElectraForPretraining
from bertjax.model.encoder import Encoder
from bertjax.model.task_heads import SequenceClassifier
from bertjax.parallel.mesh import make_mesh
from bertjax.train import warm_start
from bertjax.train.metrics_log import read_metrics
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import create_train_state
from bertjax.train.step_timing import TIMING_FIELDS
from pretrain_runs import run_child, tiny_args
from mesh_batches import batch_shapes
from trees import flat

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def electra_args(workdir, corpus, **overrides):
    """tiny_args' 12-step run (32 tokens, then 64 from step 9) on configs/electra_small.py at
    the tiny preset: a discriminator of H=128 and a generator of H=32."""
    args = tiny_args(workdir, corpus, **{"model.preset": "tiny", **overrides})
    args[1] = f"--config={REPO}/configs/electra_small.py"
    return args


def logged(workdir):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("electra") / "straight")
    result = run_child(electra_args(workdir, small_corpus_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.mark.slow
def test_a_run_logs_generator_and_discriminator_metrics(straight_run):
    records = read_metrics(straight_run)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_rtd_accuracy" in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    assert [r["seq_len"] for r in train] == [32] * 8 + [64] * 4
    assert [r["step"] for r in evals] == [6, 12]
    for key in ("loss", "mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy", "rtd_precision",
                "rtd_recall", "replaced_fraction", "grad_norm"):
        assert all(np.isfinite(r[key]) for r in train), key
    for r in train:
        np.testing.assert_allclose(r["loss"], r["mlm_loss"] + 50.0 * r["rtd_loss"], rtol=1e-4)
        # ~15% of real tokens are masked, and a replaced token is always a masked one.
        assert 0.0 < r["replaced_fraction"] < 0.25
    assert "nsp_loss" not in train[0]
    assert os.listdir(os.path.join(straight_run, "tensorboard"))
    record = json.load(open(os.path.join(straight_run, "run.json")))
    assert record["objective"] == "electra" and record["generator"]["hidden_size"] == 32
    assert record["heads"]["electra"]["generator"]["num_heads"] == 1


@pytest.mark.slow
def test_exact_resume_after_sigkill_across_the_length_switch(straight_run, tmp_path,
                                                             small_corpus_dir):
    resumed = str(tmp_path / "resumed")
    args = electra_args(resumed, small_corpus_dir)
    # Killed after the checkpoint of step 5 (32 tokens), resumed across the switch to 64 tokens
    # to the end: the generator's samples, the log and the parameters must be those of the
    # uninterrupted run. (tests/test_pretrain.py also resumes inside the long phase; the data
    # pipeline is the same.)
    result = run_child(args, KILL_AFTER_CHECKPOINT=5)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from step 5" in result.stderr
    assert logged(resumed) == logged(straight_run)
    a, b = flat(loading.load(straight_run).params), flat(loading.load(resumed).params)
    assert a.keys() == b.keys() and any(k.startswith("generator/") for k in a)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_the_runs_hugging_face_export_computes_what_the_run_does(straight_run, tmp_path):
    out = str(tmp_path / "hf")
    notes = export.export(straight_run, "hf", out)
    assert any("ElectraForMaskedLM" in note for note in notes)
    bundle = loading.load(straight_run)
    disc, params = bundle.encoder, bundle.params
    gen = loading.load(straight_run).heads["electra"]["generator"]
    from bertjax.interop.hf_electra import generator_config

    generator = generator_config({"electra": {"generator": gen}})
    discriminator = ElectraForPreTraining.from_pretrained(out).eval()
    masked_lm = ElectraForMaskedLM.from_pretrained(os.path.join(out, "generator")).eval()
    assert discriminator.config.embedding_size == 128 and masked_lm.config.hidden_size == 32
    assert os.path.isfile(os.path.join(out, "generator", "vocab.txt"))

    ids = np.array([[2, 40, 51, 600, 77, 3, 0, 0], [2, 13, 999, 15, 16, 17, 18, 3]], np.int32)
    b = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": (ids > 0) * 1,
         "masked_positions": np.array([[1, 3], [2, 6]], np.int32)}
    b["input_mask"][:, 0] = 1
    b["masked_ids"], b["masked_weights"] = ids[:, :2], np.ones((2, 2), np.float32)
    model = ElectraForPretraining(disc.replace(hidden_dropout=0.0, attention_dropout=0.0),
                                  generator)

    @jax.jit
    def ours(p, x):
        encoded = Encoder(model.config).apply({"params": p["encoder"]}, x["input_ids"],
                                              x["segment_ids"], x["input_mask"])
        rtd = DiscriminatorHead(model.config).apply({"params": p["discriminator_head"]},
                                                    encoded.sequence)
        return model.apply({"params": p}, x)["mlm_logits"], rtd

    mlm, rtd = ours(params, b)
    args = dict(input_ids=torch.from_numpy(ids).long(),
                attention_mask=torch.from_numpy(b["input_mask"]).long())
    with torch.no_grad():
        rtd_hf = discriminator(**args).logits.numpy()
        mlm_hf = masked_lm(**args).logits.numpy()
    real = b["input_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(rtd)[real], rtd_hf[real], atol=1e-5, rtol=1e-5)
    mlm_hf = np.take_along_axis(mlm_hf, b["masked_positions"][..., None].astype(np.int64), 1)
    np.testing.assert_allclose(mlm, mlm_hf, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_fine_tuning_starts_from_the_discriminator(straight_run, capsys):
    source = loading.load(straight_run)
    assert source.encoder.hidden_size == 128  # the discriminator's, not the generator's 32
    assert not warm_start.pooler_was_trained(source.heads)
    mesh = make_mesh()
    model = SequenceClassifier(source.encoder, 2)
    optimizer = make_optimizer(OptimizerConfig(total_steps=10, warmup_steps=1))
    state, shardings = create_train_state(model, optimizer, batch_shapes(mesh), mesh, seed=1)
    fresh = flat(jax.device_get(state.params))
    loaded = flat(jax.device_get(warm_start.load_encoder(
        straight_run, source.params, state.params, shardings.params, 0,
        source.encoder.num_layers, trained_pooler=False)))
    assert set(loaded) == set(fresh)  # nothing of the generator or the heads came along
    pretrained = flat(source.params)
    for name, value in loaded.items():
        if name.startswith("encoder/") and "/pooler/" not in name:
            np.testing.assert_array_equal(value, pretrained[name], err_msg=name)
        else:
            np.testing.assert_array_equal(value, fresh[name], err_msg=name)
    assert "loaded the encoder" in capsys.readouterr().err
