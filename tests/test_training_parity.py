"""Training-step parity with transformers + PyTorch: from the same weights and the same batches,
a few optimizer steps of bertjax (the fine-tuning recipe's optimizer, the task's model and loss,
the generic train step) and of transformers (BertForSequenceClassification / BertForPreTraining,
torch.optim.AdamW with the HF Trainer's decay groups, get_linear_schedule_with_warmup,
clip_grad_norm_) give the same loss, learning rate, gradients and parameters to fp32 rounding.

Dropout is off on both sides; everything else is the recipe's. Three steps cover the schedule's
first value (0: linear warmup starts from nothing) and the warmup -> decay boundary, the last
batch is a partial one (ours completed with zero-weight rows, theirs simply shorter), and the
gradient norm is large enough that clipping acts.
"""

import math
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import (BertConfig, BertForPreTraining, BertForSequenceClassification,
                          Trainer, TrainingArguments, get_linear_schedule_with_warmup)

from bertjax.inference import loading
from bertjax.finetune.tasks import TaskSettings
from bertjax.finetune.tasks.sentence import Classification
from bertjax.interop import hf_bert_config, hf_layout
from bertjax.model.heads import BertForPretraining
from bertjax.parallel.mesh import make_mesh
from bertjax.settings import finetune as finetune_settings
from bertjax.train import objectives, warm_start
from bertjax.train.optimizer import OptimizerConfig, decay_mask, make_optimizer
from bertjax.train.state import TrainState, abstract_train_state
from bertjax.train.step import make_train_step
from configs import finetune_base
from hf_reference import randomize, text_batch

TOL = dict(atol=1e-5, rtol=1e-5)
STEPS, TOTAL_STEPS, WARMUP = 3, 5, 0.25  # 5 steps, a quarter warmup: HF rounds it up to 2


def recipe(**changes):
    """The default fine-tuning recipe (configs/finetune_base.py) as the job reads it, with
    `changes` to optimizer settings."""
    config = finetune_base.get_config()
    for key, value in changes.items():
        config.optimizer[key] = value
    return finetune_settings.read(config, require_data=False)


def torch_optimizer(model: torch.nn.Module, opt: OptimizerConfig):
    """What the HF Trainer builds: AdamW over its two decay groups, linear warmup and decay."""
    decayed = set(Trainer.get_decay_parameter_names(None, model))
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": opt.weight_decay},
              {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=opt.learning_rate, betas=(opt.b1, opt.b2),
                                  eps=opt.eps)
    warmup = TrainingArguments.get_warmup_steps(types.SimpleNamespace(warmup_steps=WARMUP),
                                                TOTAL_STEPS)
    return optimizer, get_linear_schedule_with_warmup(optimizer, warmup, TOTAL_STEPS)


def torch_step(model, optimizer, schedule, clip_norm, **inputs):
    """One Trainer-style step: (loss, learning rate applied, gradient norm, gradients).

    The norm is the float64 norm of the gradients: clip_grad_norm_'s own fp32 reduction on CPU
    is off by up to ~1e-4 relative over a large embedding table (it is checked to that), and
    Adam divides the clipping factor out again anyway."""
    optimizer.zero_grad()
    loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
    clip_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm))
    norm = math.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in grads.values()))
    np.testing.assert_allclose(clip_norm, norm, rtol=2e-4)
    rate = schedule.get_last_lr()[0]
    optimizer.step()
    schedule.step()
    return loss.item(), rate, norm, grads


def torch_inputs(batch: dict, rows: int) -> dict:
    return {"input_ids": torch.from_numpy(batch["input_ids"][:rows]).long(),
            "attention_mask": torch.from_numpy(batch["input_mask"][:rows]).long(),
            "token_type_ids": torch.from_numpy(batch["segment_ids"][:rows]).long()}


def to_ours(state_dict: dict, config, *, classifier: bool) -> dict:
    """A Hugging Face state dict (parameters or gradients: the mapping is linear) in our tree."""
    state_dict = {k: np.asarray(v) for k, v in state_dict.items()}
    tree, _, unused = hf_layout.from_hf_state_dict(state_dict, config)
    if classifier:
        assert sorted(unused) == ["classifier.bias", "classifier.weight"]
        return {"encoder": tree["encoder"],
                "classifier": {"kernel": state_dict["classifier.weight"].T,
                               "bias": state_dict["classifier.bias"]}}
    assert unused == []
    return tree


def our_run(model, objective, opt: OptimizerConfig, params: dict, batches: list):
    """Our train step, as the fine-tuning and pretraining jobs compose it, on one device:
    per step (loss, learning rate, gradient norm, gradients), then the parameters after each."""
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = make_optimizer(opt)
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batches[0].items()}
    _, shardings = abstract_train_state(model, optimizer, shapes, mesh)
    params = jax.tree.map(jnp.asarray, params)
    state = jax.device_put(TrainState(step=jnp.int32(0), params=params,
                                      opt_state=optimizer.init(params),
                                      rng=jax.random.PRNGKey(0)), shardings)
    step = make_train_step(model, optimizer, mesh, shardings, objective=objective)

    @jax.jit
    def gradients(params, batch):
        def loss(p):
            outputs = model.apply({"params": p}, batch, deterministic=False,
                                  rngs={"dropout": jax.random.PRNGKey(1)})
            return objective.loss_from_sums(objective.metric_sums(outputs, batch))
        return jax.grad(loss)(params)

    results = []
    for batch in batches:
        grads = jax.device_get(gradients(state.params, batch))
        state, metrics = step(state, batch)
        metrics = jax.device_get(metrics)
        results.append((float(metrics["loss"]), float(metrics["learning_rate"]),
                        float(metrics["grad_norm"]), grads, jax.device_get(state.params)))
    return results


def flat(tree) -> dict:
    return {"/".join(str(k.key) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def assert_trees_close(ours, theirs, what: str, skip=(), **tol):
    ours, theirs = flat(ours), flat(theirs)
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        if name not in skip:
            np.testing.assert_allclose(value, theirs[name], err_msg=f"{what} {name}",
                                       **(tol or TOL))


def key_biases(tree) -> list[str]:
    """Attention key biases: softmax ignores a shift shared by all keys, so their true gradient
    is exactly 0 and both frameworks compute rounding noise (~1e-9) there, which Adam (epsilon
    1e-8) turns into updates of about lr / 10 in a direction of its own on each side. Their
    gradients are checked to be noise; their updated values are not compared."""
    return [name for name in flat(tree) if name.endswith("attention/key/bias")]


def assert_same_steps(ours, theirs, config, *, classifier: bool):
    lrs = []
    for k, ((loss, lr, norm, grads, params), (t_loss, t_lr, t_norm, t_grads, t_params)) in (
            enumerate(zip(ours, theirs))):
        np.testing.assert_allclose(loss, t_loss, err_msg=f"step {k} loss", **TOL)
        np.testing.assert_allclose(lr, t_lr, rtol=1e-6, atol=0, err_msg=f"step {k} rate")
        np.testing.assert_allclose(norm, t_norm, err_msg=f"step {k} grad norm", **TOL)
        t_grads = to_ours(t_grads, config, classifier=classifier)
        assert_trees_close(grads, t_grads, f"step {k} gradient")
        noise = key_biases(grads)
        assert noise and all(max(np.abs(flat(g)[name]).max() for g in (grads, t_grads)) < 1e-6
                             for name in noise)
        assert_trees_close(params, to_ours(t_params, config, classifier=classifier),
                           f"step {k} parameters", skip=noise)
        lrs.append(lr)
    return lrs


def classification_batches(vocab_path: str) -> list:
    """Three batches of real pairs; the third keeps 3 real rows and one zero-weight pad row."""
    batches = []
    for k in range(STEPS):
        b = text_batch(vocab_path, pairs=True, seed=k)
        del b["masked_positions"]
        b = {key: np.roll(value, k, axis=0) for key, value in b.items()}  # other rows first
        b["label"] = np.asarray([(i + k) % 3 for i in range(4)], np.int32)
        b["weight"] = np.asarray([1, 1, 1, 1 if k < STEPS - 1 else 0], np.float32)
        batches.append(b)
    return batches


def run_classification(hf: BertForSequenceClassification, config, batches, opt):
    task = Classification(TaskSettings(), ["a", "b", "c"])
    params = to_ours(hf.state_dict(), config, classifier=True)
    ours = our_run(task.model(config, False), task.objective, opt, params, batches)
    optimizer, schedule = torch_optimizer(hf, opt)
    theirs = []
    for b in batches:
        rows = int(b["weight"].sum())
        result = torch_step(hf, optimizer, schedule, opt.clip_norm,
                            labels=torch.from_numpy(b["label"][:rows]).long(),
                            **torch_inputs(b, rows))
        theirs.append((*result, {k: v.detach().numpy().copy()
                                 for k, v in hf.state_dict().items()}))
    return ours, theirs


@pytest.mark.slow
def test_a_sequence_classification_step_matches_transformers(bert_vocab_path):
    hf_config = BertConfig(vocab_size=30522, hidden_size=60, num_attention_heads=5,
                           intermediate_size=90, num_hidden_layers=2, max_position_embeddings=64,
                           num_labels=3, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, attn_implementation="eager")
    hf = BertForSequenceClassification(hf_config).train()
    randomize(hf, seed=3)
    config = hf_bert_config.encoder_config_from_hf(hf_config.to_dict(), scan_layers=True)
    opt = recipe(learning_rate=1e-3, warmup_fraction=WARMUP).optimizer_config(TOTAL_STEPS)
    ours, theirs = run_classification(hf, config, classification_batches(bert_vocab_path), opt)
    lrs = assert_same_steps(ours, theirs, config, classifier=True)
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3])
    norms = [norm for _, _, norm, _, _ in ours]
    assert max(norms) > opt.clip_norm > min(norms)  # clipped and unclipped steps


@pytest.mark.slow
def test_the_real_minilm_fine_tunes_as_in_transformers(minilm_dir, bert_vocab_path):
    hf = BertForSequenceClassification.from_pretrained(
        minilm_dir, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        dtype=torch.float32, attn_implementation="eager").train()
    hf_initial = {k: v.numpy().copy() for k, v in hf.state_dict().items()}
    config = hf_bert_config.encoder_config_from_hf(hf.config.to_dict(), scan_layers=True)
    opt = recipe(learning_rate=1e-3, warmup_fraction=WARMUP).optimizer_config(TOTAL_STEPS)
    ours, theirs = run_classification(hf, config, classification_batches(bert_vocab_path), opt)
    assert_same_steps(ours, theirs, config, classifier=True)
    # The fine-tuning job loads MiniLM's pooler too (it was trained), as transformers does.
    source = loading.load(minilm_dir)
    assert warm_start.pooler_was_trained(source.heads, source.record["initialized"])
    np.testing.assert_array_equal(source.params["encoder"]["pooler"]["kernel"],
                                  to_ours(hf_initial, config, classifier=True)["encoder"]
                                  ["pooler"]["kernel"])


@pytest.mark.parametrize("hidden,attention", [(1.0, 0.0), (0.0, 1.0)])
def test_dropout_sits_where_transformers_puts_it(bert_vocab_path, hidden, attention):
    """Dropout at rate 1 zeroes its input deterministically in both frameworks, so a training-mode
    forward pass is reproducible and depends on where every dropout sits: after the embeddings'
    LayerNorm, on the attention probabilities, after the attention and FFN output projections,
    before the classifier (none in the pooler)."""
    hf_config = BertConfig(vocab_size=30522, hidden_size=60, num_attention_heads=5,
                           intermediate_size=90, num_hidden_layers=2, max_position_embeddings=64,
                           num_labels=3, hidden_dropout_prob=hidden,
                           attention_probs_dropout_prob=attention, attn_implementation="eager")
    hf = BertForSequenceClassification(hf_config).train()
    randomize(hf, seed=5)
    config = hf_bert_config.encoder_config_from_hf(
        {**hf_config.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
        scan_layers=True)
    # A config refuses rate 1 (nothing would train); set past its check for this probe.
    object.__setattr__(config, "hidden_dropout", hidden)
    object.__setattr__(config, "attention_dropout", attention)
    model = Classification(TaskSettings(), ["a", "b", "c"]).model(config, False)
    batch = classification_batches(bert_vocab_path)[0]
    params = to_ours(hf.state_dict(), config, classifier=True)

    @jax.jit
    def forward(params, batch):
        out, state = model.apply({"params": params}, batch, deterministic=False,
                                 rngs={"dropout": jax.random.PRNGKey(0)},
                                 capture_intermediates=lambda m, _: m.name == "encoder")
        return out["logits"], state["intermediates"]["encoder"]["__call__"][0].sequence

    logits, sequence = forward(params, batch)
    with torch.no_grad():
        want = hf(**torch_inputs(batch, 4), output_hidden_states=True)
    mask = batch["input_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(sequence)[mask],
                               want.hidden_states[-1].numpy()[mask], **TOL)
    np.testing.assert_allclose(logits, want.logits.numpy(), **TOL)
    if hidden:  # the pooled output is dropped whole: the logits are the bias
        np.testing.assert_array_equal(logits, np.broadcast_to(params["classifier"]["bias"],
                                                              logits.shape))
    assert np.abs(np.asarray(sequence)[mask]).max() > 0.1


def pretraining_batches(vocab_path: str) -> list:
    """MLM + NSP batches: 5 masked positions a row ([MASK] in the input), the last prediction
    of two rows padding (weight 0; label -100 for transformers)."""
    batches = []
    for k in range(STEPS):
        b = text_batch(vocab_path, pairs=True, seed=k)
        rows = np.arange(4)[:, None]
        b["masked_ids"] = b["input_ids"][rows, b["masked_positions"]]
        b["input_ids"][rows, b["masked_positions"]] = 103  # [MASK]
        b["masked_weights"] = np.ones(b["masked_positions"].shape, np.float32)
        b["masked_weights"][1:3, -1] = 0.0
        b["masked_positions"][1:3, -1] = 0
        b["nsp_label"] = np.asarray([(i + k) % 2 for i in range(4)], np.int32)
        batches.append(b)
    return batches


def mlm_labels(batch: dict) -> np.ndarray:
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    rows, slots = np.nonzero(batch["masked_weights"])
    labels[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return labels


@pytest.mark.slow
def test_a_pretraining_step_matches_transformers(bert_vocab_path):
    hf_config = BertConfig(vocab_size=30522, hidden_size=63, num_attention_heads=7,
                           intermediate_size=130, num_hidden_layers=2,
                           max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, attn_implementation="eager")
    hf = BertForPreTraining(hf_config).train()
    randomize(hf, seed=4)
    config = hf_bert_config.encoder_config_from_hf(hf_config.to_dict(), scan_layers=False)
    # torch's AdamW always corrects the moments' bias: the fine-tuning recipe's optimizer.
    opt = recipe(learning_rate=1e-3, warmup_fraction=WARMUP).optimizer_config(TOTAL_STEPS)
    batches = pretraining_batches(bert_vocab_path)
    params = to_ours(hf.state_dict(), config, classifier=False)
    ours = our_run(BertForPretraining(config), objectives.PRETRAINING, opt, params, batches)
    optimizer, schedule = torch_optimizer(hf, opt)
    theirs = []
    for b in batches:
        result = torch_step(hf, optimizer, schedule, opt.clip_norm,
                            labels=torch.from_numpy(mlm_labels(b)),
                            next_sentence_label=torch.from_numpy(b["nsp_label"]).long(),
                            **torch_inputs(b, 4))
        theirs.append((*result, {k: v.detach().numpy().copy()
                                 for k, v in hf.state_dict().items()}))
    lrs = assert_same_steps(ours, theirs, config, classifier=False)
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3])


def test_the_default_recipe_has_the_hf_trainers_optimizer_defaults():
    """Adam's betas and epsilon, clipping, the warmup step count (rounded up), the decay groups
    and the classifier's initialization are transformers'; learning rate, batch size, warmup
    fraction and weight decay are the recipe's own (Devlin et al.), set alike in both."""
    s = recipe()
    field = {f: TrainingArguments.__dataclass_fields__[f].default
             for f in ("adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm")}
    for total in (4, 5, 30, 94, 282, 1000):
        opt = s.optimizer_config(total)
        assert (opt.b1, opt.b2, opt.eps, opt.clip_norm) == (
            field["adam_beta1"], field["adam_beta2"], field["adam_epsilon"],
            field["max_grad_norm"])
        assert opt.warmup_steps == TrainingArguments.get_warmup_steps(
            types.SimpleNamespace(warmup_steps=s.warmup_fraction), total), total

    hf_config = BertConfig(vocab_size=99, hidden_size=384, num_attention_heads=4,
                           intermediate_size=40, num_hidden_layers=2, num_labels=2)
    hf = BertForSequenceClassification(hf_config)
    config = hf_bert_config.encoder_config_from_hf(hf_config.to_dict(), scan_layers=False)
    decayed = set(Trainer.get_decay_parameter_names(None, hf))
    # 1 where the Trainer decays, 0 elsewhere, carried into our tree by the weight mapping.
    groups = to_ours({n: np.full(tuple(p.shape), float(n in decayed), np.float32)
                      for n, p in hf.named_parameters()}, config, classifier=True)
    model = Classification(TaskSettings(), ["a", "b"]).model(config, False)
    batch = {k: jnp.zeros((1, 8), jnp.int32) for k in ("input_ids", "segment_ids", "input_mask")}
    params = jax.jit(model.init)(jax.random.PRNGKey(0), batch)["params"]
    params = jax.tree.map(np.asarray, nn.meta.unbox(params))
    mask = decay_mask(params)
    assert_trees_close(jax.tree.map(lambda m, p: np.full(p.shape, float(m), np.float32),
                                    mask, params), groups, "decays", atol=0, rtol=0)
    # The fresh classifier: normal(initializer_range) kernel and zero bias, as transformers'.
    ours, theirs = params["classifier"], dict(hf.classifier.named_parameters())
    assert not ours["bias"].any() and not theirs["bias"].detach().numpy().any()
    for kernel in (ours["kernel"], theirs["weight"].detach().numpy()):
        assert abs(kernel.std() / hf_config.initializer_range - 1) < 0.15
        assert abs(kernel.mean()) < 0.005
