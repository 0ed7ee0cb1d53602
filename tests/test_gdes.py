"""Gradient-disentangled embedding sharing (GDES, DeBERTa-v3) in ELECTRA: on the real model and
objective, the discriminator's loss reaches only its residual table E_Δ and the generator's the
shared table E_G, where plain sharing lets both reach E_G; a tiny DeBERTa ELECTRA run (gdes by
default) whose readers (bertjax.load, `python -m bertjax.export --format hf`, fine-tuning's
start) all see the word table E_G + E_Δ, which a GDES pretraining run starts from with the
tables apart again, and which resumes exactly; a BERT-layout ELECTRA with
gdes exporting its discriminator with E_G + E_Δ and its generator with E_G; the setting refused
in one line before anything is written."""

import json
import os
import signal

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
from transformers import DebertaV2Model, ElectraForMaskedLM, ElectraForPreTraining

import bertjax
import cli_in_process
from bertjax.inference import loading
from bertjax.interop import params_dir
from bertjax.model import gdes
from bertjax.model.config import preset
from bertjax.model.electra import ElectraForPretraining
from bertjax.model.task_heads import SequenceClassifier
from bertjax.parallel.mesh import make_mesh
from bertjax.train import warm_start
from bertjax.train.electra_objective import MLM_WEIGHT, RTD_WEIGHT, electra_objective
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import create_train_state
from bertjax.train.step_metrics import LOSS_SUM, name
from cli_checks import assert_one_line_error
from mesh_batches import batch_shapes
from pretrain_runs import SHORT, run_child, tiny_args
from test_deberta import deberta_args
from test_pretrain import logged
from trees import flat

pytestmark = pytest.mark.slow

V = 64
WORDS = "encoder/embeddings/word_embeddings"
TEXTS = ["The cat sat on the mat.", "Two men play chess in a park, after the rain.", "Paris!"]


def batch():
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(5, V, (4, 12)).astype(np.int32),
            "segment_ids": np.zeros((4, 12), np.int32),
            "input_mask": (np.arange(12)[None] < np.array([[12], [9], [7], [12]])).astype(
                np.int32),
            "masked_positions": np.tile(np.array([1, 3, 5], np.int32), (4, 1)),
            "masked_ids": rng.integers(5, V, (4, 3)).astype(np.int32),
            "masked_weights": np.ones((4, 3), np.float32)}


def gradients(position_embedding: str, gdes_sharing: bool):
    """(params, d MLM / d params, d RTD / d params, d loss / d params) of the real model and
    objective, sampling on (the training forward pass)."""
    disc = preset("tiny", vocab_size=V, max_position_embeddings=16, hidden_size=32, num_heads=2,
                  intermediate_size=64, num_layers=2, position_embedding=position_embedding,
                  position_buckets=8 if position_embedding == "relative" else 0)
    model = ElectraForPretraining(disc, disc.replace(hidden_size=16, num_heads=1,
                                                     intermediate_size=32), gdes_sharing)
    b = batch()
    params = jax.jit(lambda key: model.init({"params": key}, b))(jax.random.PRNGKey(0))["params"]
    params = nn.meta.unbox(params)
    if gdes_sharing:  # a trained E_Δ: the discriminator's table differs from E_G
        params[gdes.WORD_DELTA] = 0.02 * jax.random.normal(jax.random.PRNGKey(1),
                                                           params[gdes.WORD_DELTA].shape)
    objective = electra_objective(50.0)

    def losses(p):
        out = model.apply({"params": p}, b, deterministic=False,
                          rngs={"dropout": jax.random.PRNGKey(3)})
        sums = objective.metric_sums(out, b)
        return (sums[name("mlm", LOSS_SUM)] / sums[MLM_WEIGHT],
                sums[name("rtd", LOSS_SUM)] / sums[RTD_WEIGHT],
                objective.loss_from_sums(sums))

    grads = [jax.jit(jax.grad(lambda p, i=i: losses(p)[i]))(params) for i in range(3)]
    return params, *(flat(g) for g in grads)


@pytest.mark.parametrize("position_embedding", ["learned", "relative"])
def test_gdes_keeps_the_discriminators_gradient_off_the_shared_table(position_embedding):
    params, mlm, rtd, total = gradients(position_embedding, gdes_sharing=True)
    assert not np.any(rtd[WORDS])                 # RTD never reaches E_G ...
    assert np.abs(rtd[gdes.WORD_DELTA]).max() > 0  # ... but E_Δ
    assert np.abs(mlm[WORDS]).max() > 0           # MLM reaches E_G ...
    assert not np.any(mlm[gdes.WORD_DELTA])       # ... and not E_Δ
    # float sums in another order: equal to 1e-7 of gradients up to 1e-3
    np.testing.assert_allclose(total[WORDS], mlm[WORDS], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(total[gdes.WORD_DELTA], 50.0 * rtd[gdes.WORD_DELTA],
                               rtol=1e-4, atol=1e-7)


def test_plain_sharing_lets_both_losses_train_the_table():
    _, mlm, rtd, _ = gradients("relative", gdes_sharing=False)
    assert np.abs(rtd[WORDS]).max() > 0 and np.abs(mlm[WORDS]).max() > 0
    assert gdes.WORD_DELTA not in rtd


def test_the_delta_starts_at_zero_shaped_and_sharded_as_the_word_table():
    disc = preset("tiny", vocab_size=V, max_position_embeddings=16)
    model = ElectraForPretraining(disc, disc.replace(hidden_size=32, num_heads=1,
                                                     intermediate_size=64), True)
    boxed = jax.eval_shape(lambda: model.init({"params": jax.random.PRNGKey(0)}, batch()))
    specs = nn.get_partition_spec(boxed)["params"]
    assert specs[gdes.WORD_DELTA] == specs["encoder"]["embeddings"]["word_embeddings"]
    params = jax.jit(lambda key: model.init({"params": key}, batch()))(jax.random.PRNGKey(0))
    params = nn.meta.unbox(params["params"])
    delta, words = params[gdes.WORD_DELTA], params["encoder"]["embeddings"]["word_embeddings"]
    assert delta.shape == words.shape and delta.dtype == words.dtype and not np.any(delta)


def gdes_args(workdir, corpus, **overrides):
    """configs/deberta.py with objective=electra (gdes by default): 6 steps, checkpoints 3, 6."""
    return deberta_args(workdir, corpus, objective="electra", **{**SHORT, **overrides})


def raw_params(workdir, step=6):
    """The checkpoint's parameters as training keeps them (E_G and E_Δ apart)."""
    return flat(params_dir.read_tree(os.path.join(workdir, "checkpoints", str(step), "state"),
                                     subtree="params"))


@pytest.fixture(scope="module")
def gdes_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("gdes") / "wd")
    result = run_child(gdes_args(workdir, small_corpus_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_a_deberta_electra_run_shares_by_gdes_and_trains_the_delta(gdes_run):
    with open(os.path.join(gdes_run, "run.json")) as f:
        record = json.load(f)
    assert record["heads"]["electra"]["embedding_sharing"] == "gdes"
    raw = raw_params(gdes_run)
    assert raw[gdes.WORD_DELTA].shape == raw[WORDS].shape
    assert np.abs(raw[gdes.WORD_DELTA]).max() > 0  # RTD trained it from zero
    view = flat(loading.load(gdes_run).params)
    assert gdes.WORD_DELTA not in view
    np.testing.assert_array_equal(view[WORDS], raw[WORDS] + raw[gdes.WORD_DELTA])
    np.testing.assert_array_equal(view[gdes.GENERATOR_WORDS], raw[WORDS])


def test_the_export_holds_the_discriminators_table_and_computes_what_bertjax_load_does(
        gdes_run, tmp_path):
    out = str(tmp_path / "hf")
    run = cli_in_process.run("export", "--workdir", gdes_run, "--format", "hf", "--output", out)
    assert run.returncode == 0, run.stderr
    hf, info = DebertaV2Model.from_pretrained(out, output_loading_info=True,
                                              attn_implementation="eager")
    assert not any(info.values()), info
    raw = raw_params(gdes_run)
    exported = hf.embeddings.word_embeddings.weight.detach().numpy()
    np.testing.assert_array_equal(exported, raw[WORDS] + raw[gdes.WORD_DELTA])
    encoded = bertjax.load(gdes_run).encode(TEXTS, layers=-1)
    for e in encoded:
        with torch.no_grad():
            theirs = hf.eval()(input_ids=torch.tensor([list(e.ids)], dtype=torch.long)
                               ).last_hidden_state.numpy()[0]
        np.testing.assert_allclose(e.hidden[0], theirs, atol=1e-4, rtol=1e-4)


def test_fine_tuning_starts_from_the_merged_table(gdes_run, capsys):
    source = loading.load(gdes_run)
    mesh = make_mesh()
    model = SequenceClassifier(source.encoder, 2)
    optimizer = make_optimizer(OptimizerConfig(total_steps=10, warmup_steps=1))
    state, shardings = create_train_state(model, optimizer, batch_shapes(mesh), mesh, seed=1)
    loaded = flat(jax.device_get(warm_start.load_encoder(
        gdes_run, source.params, state.params, shardings.params, 0,
        source.encoder.num_layers, trained_pooler=False)))
    raw = raw_params(gdes_run)
    np.testing.assert_array_equal(loaded[WORDS], raw[WORDS] + raw[gdes.WORD_DELTA])
    assert "loaded the encoder" in capsys.readouterr().err


def test_a_pretraining_run_with_gdes_starts_from_the_tables_apart(gdes_run, tmp_path,
                                                                 small_corpus_dir):
    raw = raw_params(gdes_run)
    view = loading.load(gdes_run).params
    back = flat(gdes.training_params(view, {gdes.WORD_DELTA: None}))
    assert back.keys() == raw.keys()
    np.testing.assert_array_equal(back[WORDS], raw[WORDS])
    np.testing.assert_allclose(back[gdes.WORD_DELTA], raw[gdes.WORD_DELTA], rtol=0, atol=1e-6)
    assert gdes.training_params(view, {"encoder": None}) is view  # BERT's heads: the view
    workdir = str(tmp_path / "warm")
    result = run_child(gdes_args(workdir, small_corpus_dir, **{
        "init_checkpoint": gdes_run, "train.steps": 1, "train.checkpoint_every": 1,
        "optimizer.warmup_steps": 0}))
    assert result.returncode == 0, result.stderr[-3000:]
    loaded_line = [line for line in result.stderr.splitlines() if "parameters from" in line]
    assert loaded_line and "initialized fresh" not in loaded_line[0], loaded_line


def test_exact_resume_after_sigkill(gdes_run, tmp_path, small_corpus_dir):
    resumed = str(tmp_path / "resumed")
    args = gdes_args(resumed, small_corpus_dir)
    result = run_child(args, KILL_AFTER_CHECKPOINT=3)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from step 3" in result.stderr
    assert logged(resumed) == logged(gdes_run)
    a, b = raw_params(gdes_run), raw_params(resumed)
    assert a.keys() == b.keys() and gdes.WORD_DELTA in a
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_an_electra_with_gdes_exports_each_part_with_its_own_table(tmp_path, small_corpus_dir):
    """BERT's layout, electra.embedding_sharing=gdes: the discriminator (ElectraForPreTraining)
    goes out with E_G + E_Δ, the generator (ElectraForMaskedLM, its tied output too) with E_G;
    a params export keeps both and exports the same."""
    workdir = str(tmp_path / "wd")
    args = tiny_args(workdir, small_corpus_dir, **{
        "model.preset": "tiny", "electra.embedding_sharing": "gdes", **SHORT})
    args[1] = args[1].replace("configs/tiny.py", "configs/electra_small.py")
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-3000:]
    raw = raw_params(workdir)
    params_export = str(tmp_path / "params")
    for fmt, source, out in (("hf", workdir, "hf"), ("params", workdir, "params"),
                             ("hf", params_export, "hf_from_params")):
        run = cli_in_process.run("export", "--workdir", source, "--format", fmt, "--output",
                                 str(tmp_path / out))
        assert run.returncode == 0, run.stderr
    for out in (str(tmp_path / "hf"), str(tmp_path / "hf_from_params")):
        discriminator, info = ElectraForPreTraining.from_pretrained(out, output_loading_info=True)
        assert not any(info.values()), info
        generator = ElectraForMaskedLM.from_pretrained(os.path.join(out, "generator"))
        np.testing.assert_array_equal(
            discriminator.electra.embeddings.word_embeddings.weight.detach().numpy(),
            raw[WORDS] + raw[gdes.WORD_DELTA])
        for table in (generator.electra.embeddings.word_embeddings.weight,
                      generator.generator_lm_head.weight):
            np.testing.assert_array_equal(table.detach().numpy(), raw[WORDS])


@pytest.mark.parametrize("overrides, phrase", [
    ({"objective": "electra", "electra.embedding_sharing": "shared"},
     "electra.embedding_sharing must be one of auto, plain, gdes"),
    ({"electra.embedding_sharing": "gdes"}, "needs objective=electra"),
])
def test_bad_embedding_sharing_is_refused_before_the_workdir(tmp_path, small_corpus_dir,
                                                             overrides, phrase):
    workdir = tmp_path / "wd"
    run = cli_in_process.run("main", *deberta_args(str(workdir), small_corpus_dir,
                                                   **overrides)[1:])
    assert_one_line_error(run.returncode, run.stderr, phrase)
    assert not workdir.exists()


def test_a_workdir_trained_with_gdes_refuses_plain_sharing(gdes_run, small_corpus_dir):
    before = raw_params(gdes_run)
    run = cli_in_process.run("main", *gdes_args(gdes_run, small_corpus_dir, **{
        "electra.embedding_sharing": "plain", "train.steps": 9})[1:])
    assert_one_line_error(run.returncode, run.stderr, 'embedding_sharing="gdes"')
    assert loading.checkpoint_steps(gdes_run) == [3, 6]
    after = raw_params(gdes_run)
    for key in before:
        np.testing.assert_array_equal(before[key], after[key], err_msg=key)


def test_a_workdir_from_before_the_setting_is_told_how_to_resume(tmp_path, small_corpus_dir):
    """A DeBERTa ELECTRA workdir trained with plain sharing whose record predates
    electra.embedding_sharing (no such key): auto (gdes) is refused naming the setting that
    resumes it, and that setting does."""
    workdir = str(tmp_path / "wd")
    result = run_child(gdes_args(workdir, small_corpus_dir, **{
        "electra.embedding_sharing": "plain"}))
    assert result.returncode == 0, result.stderr[-3000:]
    record = os.path.join(workdir, "run.json")
    with open(record) as f:
        stored = json.load(f)
    del stored["embedding_sharing"]
    with open(record, "w") as f:
        json.dump(stored, f)
    run = cli_in_process.run("main", *gdes_args(workdir, small_corpus_dir, **{
        "train.steps": 9})[1:])
    assert_one_line_error(run.returncode, run.stderr, "electra.embedding_sharing=plain")
    resumed = run_child(gdes_args(workdir, small_corpus_dir, **{
        "electra.embedding_sharing": "plain", "train.steps": 9}))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert loading.checkpoint_steps(workdir)[-1] == 9
