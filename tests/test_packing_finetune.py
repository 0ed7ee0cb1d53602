"""Packed fine-tuning rows (train.packing) compute what unpacked rows do: per-sequence logits, the
loss and one training step's parameters equal (fp32, 1e-5) for a BERT and a ModernBERT-style
encoder; the packing covers every sequence once per epoch with a static step count; a packed run
trains end to end and reports its padding; combinations it cannot do are one line and exit 2."""

import jax
import numpy as np
import pytest

from bertjax.finetune import objectives, schema
from bertjax.finetune.packing import PackedBatches, first_fit_decreasing, pack
from bertjax.model import config as model_config
from bertjax.model.task_heads import SequenceClassifier
from bertjax.parallel.mesh import make_mesh
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import create_train_state
from bertjax.train.step import make_train_step
from finetune_runs import finetune, results

MAX_LEN = 32
ENCODERS = {
    "bert": dict(),
    "modernbert": dict(position_embedding="rope", norm="pre", mlp="geglu", use_bias=False,
                       norm_bias=False, global_attention_every=3, sliding_window=8,
                       type_vocab_size=0, layer_norm_eps=1e-5, num_layers=3),
}


def encoder(name: str):
    return model_config.preset("tiny", vocab_size=100, max_position_embeddings=MAX_LEN,
                               hidden_dropout=0.0, attention_dropout=0.0, **ENCODERS[name])


def sentences(lengths, regression: bool, pairs: bool = True) -> dict:
    """Unpacked features: [CLS] A [SEP] B [SEP] rows of these lengths, padded to MAX_LEN."""
    rng = np.random.default_rng(0)
    n = len(lengths)
    ids = np.zeros((n, MAX_LEN), np.int32)
    segments = np.zeros_like(ids)
    for i, length in enumerate(lengths):
        ids[i, :length] = rng.integers(5, 100, length)
        ids[i, 0], ids[i, length - 1] = 2, 3
        if pairs and length > 4:
            segments[i, length // 2:length] = 1
    label = rng.normal(size=n).astype(np.float32) if regression else rng.integers(0, 3, n)
    arrays = {"input_ids": ids, "segment_ids": segments,
              "input_mask": (np.arange(MAX_LEN) < np.asarray(lengths)[:, None]).astype(np.int32),
              "label": label, "weight": np.ones(n, np.float32)}
    return schema.conform(arrays, schema.REGRESSION if regression else schema.CLASSIFICATION)


LENGTHS = [9, 3, 17, 5, 12, 30, 4, 7, 21, 6]


def packed_of(arrays: dict, regression: bool) -> tuple[dict, list]:
    batches = PackedBatches(arrays, 4, seed=1, max_seq_len=MAX_LEN, declared=(
        schema.PACKED_REGRESSION if regression else schema.PACKED_CLASSIFICATION))
    rows = batches.epoch_rows(0)
    assert len(rows) < len(arrays["weight"])  # it packs
    packed = pack(arrays, batches.lengths, rows, MAX_LEN, batches.slots)
    return packed, rows


@pytest.mark.parametrize("regression", [False, True], ids=["classification", "regression"])
@pytest.mark.parametrize("name", list(ENCODERS))
@pytest.mark.slow
def test_packed_logits_and_loss_are_the_unpacked_ones(name, regression):
    arrays = sentences(LENGTHS, regression)
    packed, rows = packed_of(arrays, regression)
    model = SequenceClassifier(encoder(name), 1 if regression else 3)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), arrays)["params"]
    apply = jax.jit(model.apply)
    alone = np.asarray(apply({"params": params}, arrays)["logits"])
    together = np.asarray(apply({"params": params}, packed)["logits"])  # [R, S, C]
    for r, members in enumerate(rows):
        np.testing.assert_allclose(together[r, :len(members)], alone[members], atol=1e-5)
    objective = objectives.REGRESSION if regression else objectives.CLASSIFICATION
    losses = [objective.loss_from_sums(objective.metric_sums({"logits": logits}, batch))
              for logits, batch in ((alone, arrays), (together, packed))]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    if regression:  # and it is the mean squared error, not only the same expression twice
        np.testing.assert_allclose(losses[1], np.mean((alone[:, 0] - arrays["label"]) ** 2),
                                   rtol=1e-5)


@pytest.mark.parametrize("name", list(ENCODERS))
@pytest.mark.slow
def test_one_packed_training_step_updates_the_parameters_as_unpacked(name):
    # 16 sequences in 8 packed rows (empty rows complete them): the tests' 8 devices split both.
    arrays = sentences(LENGTHS + [25, 8, 11, 2, 14, 19], regression=False)
    _, rows = packed_of(arrays, regression=False)
    assert len(rows) <= 8
    packed = pack(arrays, arrays["input_mask"].sum(1), rows + [np.zeros(0, int)] * (
        8 - len(rows)), MAX_LEN, MAX_LEN // 2)
    model = SequenceClassifier(encoder(name), 3)
    mesh = make_mesh()
    optimizer = make_optimizer(OptimizerConfig(learning_rate=1e-2, total_steps=10,
                                               warmup_steps=0))
    updated = []
    for batch in (arrays, packed):
        shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in arrays.items()}
        state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=0)
        step = make_train_step(model, optimizer, mesh, shardings,
                               objective=objectives.CLASSIFICATION)
        initial = jax.device_get(state.params)
        state, metrics = step(state, batch)
        updated.append(jax.device_get(state.params))
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), initial, updated[0])
    # The step moves the parameters (so equal updates are not equal nothing).
    assert moved["classifier"]["kernel"] > 1e-3 and moved["encoder"]["pooler"]["kernel"] > 1e-3
    assert np.median(jax.tree.leaves(moved)) > 1e-3
    flat = [jax.tree_util.tree_leaves_with_path(p) for p in updated]
    for (path, a), (_, b) in zip(*flat):
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_first_fit_decreasing_packs_every_sequence_once_in_a_count_fixed_by_the_lengths():
    lengths = np.random.default_rng(0).integers(2, 40, 500)
    counts = set()
    for seed in range(4):
        order = np.random.default_rng(seed).permutation(500)
        rows = first_fit_decreasing(order, lengths, 64, slots=6)
        assert sorted(np.concatenate(rows).tolist()) == list(range(500))
        assert all(lengths[r].sum() <= 64 and 1 <= len(r) <= 6 for r in rows)
        counts.add(len(rows))
    assert len(counts) == 1 and counts.pop() < 500 * lengths.mean() / 64 * 1.1


def test_packed_epochs_have_static_shapes_and_every_sequence_once():
    arrays = sentences(LENGTHS * 3, regression=False)
    batches = PackedBatches(arrays, 2, seed=0, max_seq_len=MAX_LEN,
                            declared=schema.PACKED_CLASSIFICATION)
    assert batches.slots == MAX_LEN // 3
    for epoch in range(2):
        steps = range(epoch * batches.steps_per_epoch, (epoch + 1) * batches.steps_per_epoch)
        got = [batches.batch(step) for step in steps]
        assert {b["input_ids"].shape for b in got} == {(2, MAX_LEN)}
        assert sum(b["weight"].sum() for b in got) == len(LENGTHS) * 3
        assert sum(b["input_mask"].sum() for b in got) == sum(LENGTHS) * 3
    padding = batches.padding(())
    assert 0 <= padding["packed"] < padding["padded_to_max_seq_len"]


@pytest.mark.optimized
@pytest.mark.slow
def test_a_packed_run_trains_and_reports_its_padding(tmp_path, finetune_vocab_dir):
    # 600 reviews pack as 1,200 did (seed 0: 42 of 45 steps a epoch allowed, packed padding 0.033;
    # 1,200: 83 of 90, 0.015); no learning is asserted, so 100 eval examples suffice.
    n = 600
    settings = {"data.tokenizer": finetune_vocab_dir, "data.max_train_examples": n,
                "data.max_eval_examples": 100, "data.max_seq_len": 64, "train.epochs": 2,
                "train.batch_size": 8, "train.bucket_multiple": 16}
    packed = str(tmp_path / "packed")
    assert finetune("finetune_sentiment", packed, **settings, **{"train.packing": "true"}) == 0
    r = results(packed)
    padding = r["train_padding"]
    assert padding["packed"] < padding["length_buckets"] < padding["padded_to_max_seq_len"]
    assert padding["packed"] < 0.15
    assert r["steps_per_epoch"] < 0.6 * n / 8  # two sentences a row, most rows
    assert r["finished"] and len(r["history"]) == 2 and 0 <= r["best_metric"] <= 1


@pytest.mark.parametrize("config, settings, message", [
    ("finetune_sentiment", {"task": "finetune_token_classification"},
     "train.packing works with task="),
    ("finetune_sentiment", {"finetune.method": "soft_prompt"}, "finetune.method=soft_prompt"),
    ("finetune_sentiment", {"finetune.method": "cloze", "finetune.verbalizer": "neg:bad,pos:good"},
     "finetune.method=cloze"),
    ("distill", {"distill.teacher": "teacher", "distill.student_layers": 0}, "distillation"),
])
def test_packing_it_cannot_do_is_one_line_and_exit_2(config, settings, message, tmp_path, capsys,
                                                    finetune_vocab_dir):
    capsys.readouterr()
    assert finetune(config, str(tmp_path / "wd"), **settings, **{
        "data.tokenizer": finetune_vocab_dir, "train.packing": "true"}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
