"""The multilingual configs exported to Hugging Face: a tiny run of configs/mbert.py,
configs/xlmr.py and configs/xlm_tlm.py on two generated languages, exported with
`python -m bertjax.export --format hf`, loads in the matching *ForMaskedLM with no missing or
unexpected keys, and its MLM scores equal bertjax's within 1e-4 (fp32) on padded rows. XLM's
language embedding is BERT's token-type table: transformers reads it from token_type_ids.
"""

import json
import os

import jax
import numpy as np
import pytest
import torch
from transformers import AutoModelForMaskedLM, BertForMaskedLM, XLMRobertaForMaskedLM

from bertjax.inference import loading
from bertjax.model.heads import BertForPretraining
from test_tlm import write_texts
from pretrain_runs import REPO, run_child, tiny_args
from pretrain_runs import run_cli as run_module

pytestmark = pytest.mark.slow

RUN = {"model.preset": "tiny", "data.vocab_size": 300, "data.eval_fraction": 0.1,
       "train.steps": 3, "train.eval_every": 3, "train.checkpoint_every": 3,
       "schedule.long_fraction": 0.0, "model.hidden_dropout": 0.0}
NSP_HEAD = {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
            "cls.seq_relationship.bias"}
# What a *ForMaskedLM does not read: mBERT keeps BERT's NSP (its export is a BertForPreTraining);
# an MLM-only BERT-layout export keeps its pooler for BertModel and sequence classification;
# RobertaForMaskedLM's export has neither.
UNREAD = {"mbert": NSP_HEAD, "xlm_tlm": {"bert.pooler.dense.weight", "bert.pooler.dense.bias"},
          "xlmr": set()}
CONFIGS = {
    # config: (its class in transformers, its own settings, the language id the rows carry)
    "mbert": (BertForMaskedLM, {}, 0),
    "xlmr": (XLMRobertaForMaskedLM, {}, 0),
    "xlm_tlm": (BertForMaskedLM, {"data.tlm_fraction": 0.5}, 1),
}


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """Two generated languages and their translation pairs (tests/test_tlm.py's)."""
    return write_texts(tmp_path_factory.mktemp("languages"))


def config_args(name, workdir, corpus, texts, settings):
    overrides = {**RUN, "data.languages": f"aa={texts['aa']},bb={texts['bb']}", **settings}
    if "data.tlm_fraction" in settings:
        overrides["data.parallel"] = f"aa-bb={texts['pairs']}"
    args = tiny_args(workdir, corpus, **overrides)
    return [args[0], f"--config={REPO}/configs/{name}.py", *args[2:]]


def padded_rows(bundle):
    """Three rows of 20, 13 and 7 tokens ([CLS]/<s> ... [SEP]/</s>), padded."""
    special, rng = bundle.tokenizer().special, np.random.default_rng(2)
    ids = np.full((3, 20), special.pad, np.int32)
    for row, length in enumerate((20, 13, 7)):
        ids[row, :length] = rng.integers(5, bundle.encoder.vocab_size, length)
        ids[row, 0], ids[row, length - 1] = special.cls, special.sep
    return ids, (ids != special.pad).astype(np.int32)


def our_scores(bundle, ids, mask, language):
    batch = {"input_ids": ids, "segment_ids": np.full_like(ids, language), "input_mask": mask,
             "masked_positions": np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32),
                                                 ids.shape)}
    heads = BertForPretraining(bundle.encoder, nsp="nsp" in bundle.params)
    return np.asarray(jax.jit(heads.apply)({"params": bundle.params}, batch)["mlm_logits"])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_multilingual_run_exports_to_its_transformers_class(name, texts, tmp_path):
    hf_class, settings, language = CONFIGS[name]
    workdir, out = str(tmp_path / "run"), str(tmp_path / "hf")
    result = run_child(config_args(name, workdir, str(tmp_path / "corpus"), texts, settings))
    assert result.returncode == 0, result.stderr[-3000:]
    done = run_module("bertjax.export", "--workdir", workdir, "--format", "hf", "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    reloaded, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True,
                                                          attn_implementation="eager")
    assert type(reloaded) is hf_class, type(reloaded)
    assert info["unexpected_keys"] == UNREAD[name] and not info["missing_keys"], info
    assert not info["mismatched_keys"] and not info["error_msgs"], info
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        keys = {k for line in f for k in json.loads(line)}
    assert {"eval_mlm_accuracy_aa", "eval_mlm_accuracy_bb"} <= keys

    bundle = loading.load(workdir)
    ids, mask = padded_rows(bundle)
    with torch.no_grad():
        theirs = reloaded.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                                 attention_mask=torch.tensor(mask),
                                 token_type_ids=torch.full(ids.shape, language)).logits.numpy()
    real = mask.astype(bool)  # padding's own scores differ by design (RoBERTa's positions)
    np.testing.assert_allclose(our_scores(bundle, ids, mask, language)[real], theirs[real],
                               atol=1e-4, rtol=1e-4)
