"""Length buckets in fine-tuning: training batches grouped by bucket (every row once an epoch, a
pure function of seed and epoch, the same on every process), evaluation outputs equal to the
uncut ones, and a real run that compiles one step per bucket and pads far less."""

import json
import os

import jax
import numpy as np
import optax
import pytest

from bertjax.core import length_buckets

from bertjax.inference import loading

from bertjax.cli import main
from bertjax.finetune import evaluation, length_bucketing, readers
from bertjax.finetune.batches import EpochBatches
from bertjax.finetune.tasks import TaskSettings, make_task
from bertjax.model.config import preset
from bertjax.parallel.mesh import make_mesh
from bertjax.train.state import abstract_train_state
from bertjax.train.step import make_predict_step
import finetune_data
import run_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bucket_lengths_and_fitting():
    assert length_buckets.bucket_lengths(32, 128) == (32, 64, 96, 128)
    assert length_buckets.bucket_lengths(32, 100) == (32, 64, 96, 100)
    assert length_buckets.bucket_lengths(0, 128) == (128,)
    assert length_buckets.bucket_lengths(256, 128) == (128,)
    buckets = (32, 64, 96, 100)
    assert [length_buckets.fitting(n, buckets) for n in (1, 32, 33, 96, 97, 100)] == \
        [32, 32, 64, 96, 100, 100]


def test_row_lengths_end_at_the_last_real_token():
    mask = np.array([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 1, 0]])
    assert length_bucketing.row_lengths({"input_mask": mask}).tolist() == [3, 1, 5, 4]
    assert length_bucketing.row_lengths({"query_mask": mask}) is None


def synthetic(rows: int, max_len: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, max_len + 1, rows)
    mask = (np.arange(max_len)[None] < lengths[:, None]).astype(np.int32)
    return {"input_ids": mask * rng.integers(5, 100, (rows, max_len)), "input_mask": mask,
            "segment_ids": np.zeros((rows, max_len), np.int32),
            "label_ids": mask * rng.integers(0, 3, (rows, max_len)),
            "label": np.arange(rows), "weight": np.ones(rows, np.float32)}


def test_training_batches_use_every_row_once_an_epoch_in_few_shapes():
    arrays = synthetic(1000, 128, 0)
    buckets = length_buckets.bucket_lengths(32, 128)
    batches = EpochBatches(arrays, 32, seed=3, buckets=buckets)
    lengths = length_bucketing.row_lengths(arrays)
    for epoch in (0, 1):
        seen = []
        for step in range(epoch * batches.steps_per_epoch, (epoch + 1) * batches.steps_per_epoch):
            batch = batches.batch(step)
            length = batch["input_ids"].shape[1]
            assert length in buckets and batch["label_ids"].shape[1] == length
            real = batch["label"][batch["weight"] > 0]
            assert lengths[real].max() <= length  # nothing real is cut
            np.testing.assert_array_equal(batch["input_ids"], arrays["input_ids"][
                batch["label"], :length])
            seen += real.tolist()
        assert sorted(seen) == list(range(1000))
    # A batch draws from one bucket: most are far shorter than max_seq_len.
    bucketed, unbucketed = batches.padding()
    assert bucketed < unbucketed / 3, (bucketed, unbucketed)
    assert batches.length_bound() == 128


def test_training_batches_are_a_pure_function_of_seed_and_step():
    arrays = synthetic(500, 64, 1)
    buckets = length_buckets.bucket_lengths(16, 64)
    a, b = EpochBatches(arrays, 16, seed=5, buckets=buckets), EpochBatches(arrays, 16, seed=5,
                                                                           buckets=buckets)
    steps = list(range(3 * a.steps_per_epoch))
    for step in np.random.default_rng(0).permutation(steps):  # b in any order, as on resume
        np.testing.assert_array_equal(a.batch(int(step))["label"], b.batch(int(step))["label"])
    epochs = [sorted(tuple(a.batch(s)["label"]) for s in range(e * a.steps_per_epoch,
                                                                (e + 1) * a.steps_per_epoch))
              for e in (0, 1)]
    assert epochs[0] != epochs[1]  # the batches are drawn afresh every epoch
    other = EpochBatches(arrays, 16, seed=6, buckets=buckets)
    assert any(not np.array_equal(a.batch(s)["label"], other.batch(s)["label"]) for s in steps)


def test_each_process_feeds_its_block_of_the_same_bucket():
    arrays = synthetic(300, 64, 2)
    buckets = length_buckets.bucket_lengths(16, 64)
    whole = EpochBatches(arrays, 8, seed=0, buckets=buckets)
    halves = [EpochBatches(arrays, 8, seed=0, buckets=buckets, process_index=i,
                           process_count=2) for i in range(2)]
    for step in range(2 * whole.steps_per_epoch):
        parts = [h.batch(step) for h in halves]
        joined = whole.batch(step)
        assert {p["input_ids"].shape[1] for p in parts} == {joined["input_ids"].shape[1]}
        for key in joined:
            np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), joined[key])


def test_without_an_input_mask_or_buckets_nothing_is_cut():
    arrays = synthetic(40, 32, 3)
    plain = EpochBatches(arrays, 8, seed=0)
    assert plain.batch(0)["input_ids"].shape[1] == 32 and plain.length(0) is None
    dual = {"query_ids": arrays["input_ids"], "query_mask": arrays["input_mask"],
            "weight": arrays["weight"]}
    assert EpochBatches(dual, 8, seed=0, buckets=(16, 32)).batch(0)["query_ids"].shape[1] == 32


def _outputs(task, features, examples, buckets):
    """Evaluator outputs and metrics of a tiny random encoder with the task's head."""
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    encoder = preset("tiny", vocab_size=30522, max_position_embeddings=128)
    model = task.model(encoder, False)
    batch_size = 16
    shapes = {k: jax.ShapeDtypeStruct((batch_size, *v.shape[1:]), v.dtype)
              for k, v in features.arrays.items()}
    _, shardings = abstract_train_state(model, optax.identity(), shapes, mesh)
    first = {k: v[:batch_size] for k, v in features.arrays.items()}
    params = jax.device_put(model.init(jax.random.PRNGKey(0), first)["params"],
                            shardings.params)
    ev = evaluation.Evaluator(task, make_predict_step(model, mesh, shardings), mesh, features,
                              examples, batch_size, slice(0, batch_size), buckets)
    return ev.outputs(params), ev.metrics(params)


@pytest.mark.parametrize("name", ["finetune_classification", "finetune_token_classification",
                                  "finetune_qa"])
@pytest.mark.slow
def test_bucketed_evaluation_equals_uncut(name, minilm_dir, demo_articles):
    tokenizer = loading.load(minilm_dir).tokenizer()
    if name == "finetune_qa":
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"bucket_qa_{os.getpid()}.json")
        finetune_data.write_squad(path, finetune_data.year_questions(demo_articles)[:40])
        examples = readers.read(readers.Source(path), "qa")
        os.unlink(path)
        labels = []
    elif name == "finetune_token_classification":
        examples = readers.read(readers.Source("packaged:tweet_ner:dev"), "tagged")[:50]
        labels = sorted({t for e in examples for t in e.tags})
    else:
        examples = readers.read(readers.Source("packaged:movie_reviews:dev"), "text")[:50]
        labels = ["negative", "positive"]
    settings = TaskSettings(max_seq_len=128, labels=tuple(labels), doc_stride=64)
    task = make_task(name, settings, labels, tokenizer)
    features = task.featurize(tokenizer, examples, "dev", training=False)
    lengths = length_bucketing.row_lengths(features.arrays)
    assert lengths.min() < 64 and len(set(lengths.tolist())) > 5  # a real mix to bucket
    uncut, uncut_metrics = _outputs(task, features, examples, ())
    cut, cut_metrics = _outputs(task, features, examples, (16, 32, 48, 64, 96, 128))
    for key in uncut:
        assert cut[key].shape == uncut[key].shape
        real = np.arange(uncut[key].shape[1])[None] < lengths[:, None] if \
            uncut[key].ndim > 1 and uncut[key].shape[1] == 128 else np.ones(
                uncut[key].shape[:1], bool)
        np.testing.assert_allclose(cut[key][real], uncut[key][real], atol=2e-5, rtol=1e-4)
    assert json.dumps(cut_metrics, sort_keys=True, default=str) == json.dumps(
        uncut_metrics, sort_keys=True, default=str)


@pytest.mark.slow
def test_a_fine_tuning_run_compiles_a_step_per_bucket_and_pads_less(tmp_path, capsys,
                                                                     minilm_dir):
    workdir = str(tmp_path / "wd")
    argv = ["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
            f"--workdir={workdir}", "--config.model.preset=tiny",
            f"--config.data.tokenizer={minilm_dir}",
            "--config.data.max_train_examples=256", "--config.data.max_eval_examples=64",
            "--config.data.max_seq_len=128", "--config.train.bucket_multiple=32",
            "--config.train.epochs=1", "--config.train.batch_size=32",
            *(f"--config.{k}={v}" for k, v in run_devices.IN_A_WORKER.items())]
    assert main.main(argv) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("length buckets"))
    bucketed, unbucketed = [float(w) for w in line.split() if w.replace(".", "").isdigit()][:2]
    assert bucketed < unbucketed / 2, line
    compiled = [x for x in err.splitlines() if x.startswith("compiled fine-tuning train step")]
    assert 1 < len(compiled) <= 4 and all(" tokens (" in x for x in compiled), compiled
    with open(os.path.join(workdir, "results.json")) as f:
        assert json.load(f)["finished"]
