"""Adapters and LoRA (`finetune.method=adapter|lora`): each trains end to end through
`python -m bertjax.main` on the packaged movie reviews and beats the majority class; the base
weights are bit-identical after training; the optimizer state holds the trainable parameters
alone; LoRA merged into the base is a plain BERT that transformers loads and that computes what
the unmerged model does; the adapters export holds only what was trained and loads back onto its
base; bad input is one line and exit 2.

The base is real and small: the all-MiniLM-L6-v2 import cut to its embeddings, its last layer
and its pooler. (A randomly initialized encoder is no base for these methods: its [CLS] state
hardly depends on the input, and frozen, nothing downstream can make it.)
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import traverse_util
from transformers import BertForSequenceClassification

import bertjax
from bertjax.cli import export
from bertjax.inference import loading
from bertjax.cli import main
from bertjax.core.errors import UserError
from bertjax.finetune import readers
from bertjax.interop import params_dir
from bertjax.model import adaptation, layout
from bertjax.model.config import preset
from bertjax.model.encoder import Encoder
from bertjax.model.task_heads import SequenceClassifier
from cli_checks import assert_one_line_error, run_cli
import compile_effort
import run_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_LAYERS = [5]  # of MiniLM's 6: the last one, whose [CLS] state its pooler was trained on
RUN = {"data.max_train_examples": 1000, "data.max_eval_examples": 400, "data.max_seq_len": 32,
       "train.epochs": 2, "train.batch_size": 16, "train.log_every": 10,
       "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0, **run_devices.IN_A_WORKER}
LORA = {"finetune.method": "lora", "optimizer.learning_rate": 5e-3}
# The loop layout with remat: the other encoder path of the two runs.
ADAPTER = {"finetune.method": "adapter", "optimizer.learning_rate": 2e-3,
           "model.scan_layers": False, "model.remat": "full"}


def finetune(workdir: str, base: str, **settings) -> int:
    argv = ["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
            f"--workdir={workdir}", f"--config.init_checkpoint={base}"]
    return main.main(argv + [f"--config.{k}={v}" for k, v in {**RUN, **settings}.items()])


def flat(tree) -> dict:
    return traverse_util.flatten_dict(dict(tree), sep="/")


def best_checkpoint(workdir: str) -> str:
    with open(os.path.join(workdir, "results.json")) as f:
        step = json.load(f)["best_step"]
    return os.path.join(workdir, "checkpoints", str(step), "state")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, minilm_dir) -> str:
    """A params export of MiniLM's embeddings, last layer and pooler (real pretrained weights)."""
    minilm = loading.load(minilm_dir)
    encoder = layout.to_scanned(minilm.params["encoder"])
    encoder["layers"] = jax.tree.map(lambda x: np.asarray(x)[BASE_LAYERS], encoder["layers"])
    model = minilm.encoder.replace(num_layers=len(BASE_LAYERS), scan_layers=True)
    directory = str(tmp_path_factory.mktemp("base") / "minilm_top")
    return params_dir.save(directory, {"encoder": encoder}, model, heads=minilm.heads,
                           tokenizer=minilm.tokenizer())


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, base_dir) -> str:
    workdir = str(tmp_path_factory.mktemp("lora") / "wd")
    with compile_effort.compiled(optimized=True):  # it trains to beat the majority class
        assert finetune(workdir, base_dir, **LORA) == 0
    return workdir


@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory, base_dir) -> str:
    workdir = str(tmp_path_factory.mktemp("adapter") / "wd")
    with compile_effort.compiled(optimized=True):  # it trains to beat the majority class
        assert finetune(workdir, base_dir, **ADAPTER) == 0
    return workdir


def majority_accuracy() -> float:
    labels = [e.label for e in readers.read(readers.Source("packaged:movie_reviews:dev"),
                                            "text")]
    return max(labels.count(x) for x in set(labels)) / len(labels)


@pytest.mark.parametrize("run", ["lora_run", "adapter_run"])
@pytest.mark.slow
def test_each_method_learns_above_the_majority_class(run, request):
    workdir = request.getfixturevalue(run)
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    assert results["finished"]
    assert results["best_metric"] > majority_accuracy() + 0.1, results["history"]
    with open(os.path.join(workdir, "run.json")) as f:
        record = json.load(f)
    method = run.split("_")[0]
    assert record["method"] == method
    assert record["adaptation"] == {"method": method, "fresh": []}  # MiniLM's pooler was trained
    assert record["model"][{"lora": "lora_rank", "adapter": "adapter_size"}[method]] > 0


@pytest.mark.parametrize("run", ["lora_run", "adapter_run"])
@pytest.mark.slow
def test_base_weights_are_bit_identical_after_training(run, request, base_dir):
    workdir = request.getfixturevalue(run)
    method = run.split("_")[0]
    trained = flat(params_dir.read_tree(best_checkpoint(workdir), subtree="params"))
    model = loading.describe(workdir).require_encoder()
    base = flat({"encoder": layout.like(loading.load(base_dir).params["encoder"],
                                        model.scan_layers)})
    frozen = [n for n in trained if not adaptation.trains(n, method)]
    assert set(base) <= set(trained)  # every base weight is in the model, under its own name
    assert set(frozen) == {n for n in base if not adaptation.trains(n, method)}
    for name in frozen:
        assert trained[name].dtype == base[name].dtype, name
        assert trained[name].tobytes() == base[name].tobytes(), name
    changed = [n for n in trained if n in base and adaptation.trains(n, method)]
    assert all(not np.array_equal(trained[n], base[n]) for n in changed)
    assert bool(changed) == (method == "adapter")  # its LayerNorms train
    added = [n for n in trained if adaptation.added(n)]
    assert added and all(np.abs(trained[n]).max() > 0 for n in added)


def state_bytes(tree) -> int:
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("run", ["lora_run", "adapter_run"])
@pytest.mark.slow
def test_optimizer_state_exists_only_for_trainable_parameters(run, request):
    workdir = request.getfixturevalue(run)
    method = run.split("_")[0]
    checkpoint = best_checkpoint(workdir)
    params = flat(params_dir.read_tree(checkpoint, subtree="params"))
    opt_state = params_dir.read_tree(checkpoint, subtree="opt_state")
    trainable = sum(v.nbytes for n, v in params.items() if adaptation.trains(n, method))
    total = sum(v.nbytes for v in params.values())
    # AdamW's two moments of each trainable parameter, and a few scalar counters.
    assert 2 * trainable <= state_bytes(opt_state) <= 2 * trainable + 64
    assert state_bytes(opt_state) < 0.1 * 2 * total  # full fine-tuning keeps 2 x total
    moments = [leaf for leaf in jax.tree.leaves(opt_state) if np.ndim(leaf)]
    assert len(moments) == 2 * sum(adaptation.trains(n, method) for n in params)


def dev_batch(tokenizer, count=24, length=32) -> dict:
    sentences = [e.text for e in readers.read(
        readers.Source("packaged:movie_reviews:dev"), "text")[:count]]
    ids = np.zeros((count, length), np.int32)
    for row, sentence in enumerate(sentences):
        tokens = [tokenizer.special.cls, *tokenizer.encode(sentence)[:length - 2],
                  tokenizer.special.sep]
        ids[row, :len(tokens)] = tokens
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids),
            "input_mask": (ids != 0).astype(np.int32)}


def logits_of(model, params, batch) -> np.ndarray:
    return np.asarray(SequenceClassifier(model, 2).apply({"params": params}, batch)["logits"])


@pytest.mark.slow
def test_lora_merged_into_the_base_is_a_plain_bert_with_the_same_outputs(lora_run, tmp_path,
                                                                       capsys):
    out = str(tmp_path / "hf")
    code, stdout, err = run_cli(export, ["--workdir", lora_run, "--format", "hf",
                                         "--merge-lora", "--output", out], capsys)
    assert code == 0 and "wrote the Hugging Face export" in stdout, err
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["architectures"] == ["BertForSequenceClassification"]
    hf = BertForSequenceClassification.from_pretrained(out).eval()

    trained = loading.load(lora_run)
    model = trained.require_encoder()
    batch = dev_batch(trained.tokenizer())
    ours = logits_of(model, trained.params, batch)
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                    attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
                    token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long)
                    ).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)
    # The LoRA updates matter: without them the same head computes something else.
    without = jax.tree_util.tree_map_with_path(
        lambda path, x: np.zeros_like(x) if "lora" in jax.tree_util.keystr(path) else x,
        trained.params)
    assert np.abs(logits_of(model, without, batch) - ours).max() > 1e-2

    code, _, err = run_cli(export, ["--workdir", lora_run, "--format", "hf", "--output",
                                    str(tmp_path / "unmerged")], capsys)
    assert_one_line_error(code, err, "LoRA run", "--merge-lora")
    assert not os.path.exists(tmp_path / "unmerged")


@pytest.mark.slow
def test_adapters_export_holds_the_trained_parameters_and_loads_onto_its_base(
        adapter_run, base_dir, minilm_dir, tmp_path, capsys):
    out = str(tmp_path / "adapters")
    code, stdout, err = run_cli(export, ["--workdir", adapter_run, "--format", "adapters",
                                         "--output", out], capsys)
    assert code == 0 and "wrote the adapters export" in stdout, err
    own = flat(params_dir.read_tree(os.path.join(out, "params")))
    assert own and all(adaptation.trains(n, "adapter") for n in own)
    assert any(adaptation.added(n) for n in own) and "classifier/kernel" in own
    assert sum(v.nbytes for v in own.values()) < 0.05 * sum(
        v.nbytes for v in flat(loading.load(base_dir).params).values())

    whole = flat(loading.load(adapter_run).params)
    loaded = flat(loading.load(out).params)  # the base found through the export's record
    assert loaded.keys() == whole.keys()
    assert all(loaded[n].tobytes() == whole[n].tobytes() for n in whole)
    sentences = ["a gripping, beautifully acted film", "dull and far too long"]
    assert bertjax.load(out, base=base_dir).predict(sentences) == bertjax.load(
        adapter_run).predict(sentences)
    with pytest.raises(UserError, match="not the one these adapters"):
        loading.load(out, base=minilm_dir)  # all six layers: another base

    code, _, err = run_cli(export, ["--workdir", adapter_run, "--format", "hf", "--output",
                                    str(tmp_path / "hf")], capsys)
    assert_one_line_error(code, err, "adapter run", "no Hugging Face BERT counterpart")


@pytest.mark.slow
def test_lora_adds_nothing_at_init_and_both_methods_agree_across_layouts():
    """LoRA starts as the base model exactly (b = 0), adapters nearly (up-projection near 0);
    scanned and per-layer layouts, with and without remat, compute the same."""
    ids = jnp.asarray(np.random.default_rng(0).integers(5, 1000, (2, 12)), jnp.int32)
    inputs = (ids, jnp.zeros_like(ids), jnp.ones_like(ids))

    def run(model, params):  # jitted: op-by-op dispatch of the layers is slower than compiling
        return jax.jit(Encoder(model).apply)({"params": params}, *inputs).sequence

    def init(model, seed):
        return nn.meta.unbox(jax.jit(Encoder(model).init)(jax.random.key(seed), *inputs)[
            "params"])

    base_model = preset("tiny", vocab_size=1000, scan_layers=True)
    # The base weights: a LoRA model's initialization less what LoRA adds (an initializer
    # compiled once, for the LoRA model; its fresh parameters below come from another seed).
    lora_init = jax.jit(Encoder(base_model.replace(lora_rank=4)).init)
    base_params = traverse_util.unflatten_dict({
        tuple(k.split("/")): v for k, v in flat(nn.meta.unbox(lora_init(
            jax.random.key(0), *inputs)["params"])).items() if not adaptation.added(k)})
    base_out = run(base_model, base_params)
    for adapted, tolerance in ((dict(lora_rank=4), 0.0), (dict(adapter_size=8), 2e-2)):
        model = base_model.replace(**adapted)
        fresh = (nn.meta.unbox(lora_init(jax.random.key(1), *inputs)["params"])
                 if "lora_rank" in adapted else init(model, 1))
        params = {**flat(fresh), **flat(base_params)}  # the base weights, loaded by name
        assert set(flat(fresh)) - set(flat(base_params)) == {
            n for n in flat(fresh) if adaptation.added(n)}
        params = traverse_util.unflatten_dict({tuple(k.split("/")): v
                                               for k, v in params.items()})
        out = run(model, params)
        assert float(jnp.abs(out - base_out).max()) <= tolerance
        assert tolerance == 0.0 or float(jnp.abs(out - base_out).max()) > 0.0
        for scan, remat in ((False, "full"), (True, "save_dots")):
            other = model.replace(scan_layers=scan, remat=remat)
            np.testing.assert_allclose(run(other, layout.like(params, scan)), out, atol=1e-6)


def run_main(argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main.main(["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py", *argv])
    return code, capsys.readouterr().err


def expect_refusal(tmp_path, capsys, base, phrases, **settings):
    workdir = tmp_path / "refused"
    code, err = run_main([f"--workdir={workdir}", f"--config.init_checkpoint={base}"]
                         + [f"--config.{k}={v}" for k, v in settings.items()], capsys)
    assert_one_line_error(code, err, *phrases)
    assert not workdir.exists()


def test_bad_settings_are_one_line_and_write_nothing(tmp_path, capsys, base_dir):
    expect_refusal(tmp_path, capsys, base_dir, ["adapter_size must be positive, got 0"],
                   **{"finetune.method": "adapter", "finetune.adapter_size": 0})
    expect_refusal(tmp_path, capsys, base_dir, ["lora_rank 500", "hidden size 384"],
                   **{"finetune.method": "lora", "finetune.lora_rank": 500})
    expect_refusal(tmp_path, capsys, base_dir, ["freeze_encoder", "method=lora"],
                   **{"finetune.method": "lora", "finetune.freeze_encoder": True})
    expect_refusal(tmp_path, capsys, base_dir, ["reinit_top_layers", "frozen"],
                   **{"finetune.method": "adapter", "finetune.reinit_top_layers": 1})
    expect_refusal(tmp_path, capsys, "", ["set config.init_checkpoint"],
                   **{"finetune.method": "lora", "model.preset": "tiny"})
    expect_refusal(tmp_path, capsys, base_dir, ["lora_rank 200", "hidden size 128"],
                   **{"finetune.method": "lora", "model.preset": "tiny",
                      "finetune.lora_rank": 200})


@pytest.mark.slow
def test_a_lora_workdir_refuses_another_method(lora_run, base_dir, capsys):
    """Refused once the task's labels are known (the data is read first), before any write."""
    before = sorted(os.listdir(lora_run))
    code, err = run_main([f"--workdir={lora_run}", f"--config.init_checkpoint={base_dir}",
                          "--config.finetune.method=adapter"], capsys)
    assert_one_line_error(code, err.splitlines(keepends=True)[-1], "holds a run with",
                          "use a new workdir")
    assert sorted(os.listdir(lora_run)) == before


@pytest.mark.slow
def test_an_adapter_checkpoint_starts_no_run_that_would_drop_its_adapters(
        adapter_run, tmp_path, capsys):
    expect_refusal(tmp_path, capsys, adapter_run, ["has adapters", "method=lora would drop"],
                   **{"finetune.method": "lora"})
