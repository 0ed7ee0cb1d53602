"""Fine-tuned RoBERTa, XLM-RoBERTa, DeBERTa and ALBERT checkpoints exported with `python -m
bertjax.export --format hf`: each loads in its family's task class (RobertaForSequenceClassification,
DebertaV2ForTokenClassification, AlbertForQuestionAnswering, ...) with no missing or unexpected
weights and computes what our encoder and head compute, within 1e-5 in fp32, on padded rows.
(BERT's task classes: tests/test_export.py.)
"""

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from bertjax.cli import export
from bertjax.data.tokenizer import WordPieceTokenizer
from bertjax.interop import hf_files
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from cli_checks import run_cli
from hf_reference import TOL
from saved_runs import random_params, save_workdir

pytestmark = pytest.mark.slow

SIZES = dict(vocab_size=30522, hidden_size=48, num_heads=3, intermediate_size=80, num_layers=2,
             max_position_embeddings=66)
FAMILIES = {  # family: (class prefix, encoder settings, the heads record's extra keys)
    "roberta": ("Roberta", dict(type_vocab_size=1, pad_token_id=1, positions_from_padding=True,
                                layer_norm_eps=1e-5), {}),
    "xlm-roberta": ("XLMRoberta", dict(type_vocab_size=1, pad_token_id=1,
                                       positions_from_padding=True, layer_norm_eps=1e-5),
                    {"hf_model_type": "xlm-roberta"}),
    "deberta-v2": ("DebertaV2", dict(type_vocab_size=0, position_embedding="relative",
                                     position_buckets=8, max_relative_positions=64,
                                     layer_norm_eps=1e-7), {}),
    "albert": ("Albert", dict(embedding_size=16, share_layers=True, activation="gelu_tanh"), {}),
}
HEADS = {  # head: (class suffix, labels, our output layer)
    "sequence_classification": ("ForSequenceClassification", ["neg", "neu", "pos"], "classifier"),
    "token_classification": ("ForTokenClassification", ["O", "B-X", "I-X"], "classifier"),
    "question_answering": ("ForQuestionAnswering", ["start", "end"], "qa_outputs"),
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, bert_vocab_path):
    directory = str(tmp_path_factory.mktemp("tokenizer") / "tokenizer")
    WordPieceTokenizer.from_vocab_file(bert_vocab_path).save(directory)
    return directory


def padded_rows(config: EncoderConfig):
    """Rows of 40, 23 and 9 tokens (past the DeBERTa buckets' exact range), padded."""
    rng = np.random.default_rng(4)
    ids = np.full((3, 40), config.pad_token_id, np.int32)
    for row, length in enumerate((40, 23, 9)):
        ids[row, :length] = rng.integers(5, config.vocab_size, length)
    return ids, (ids != config.pad_token_id).astype(np.int32)


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_fine_tuned_model_exports_to_its_family_task_class(family, head, tmp_path, capsys,
                                                              tokenizer_dir):
    prefix, settings, record = FAMILIES[family]
    suffix, labels, layer = HEADS[head]
    config = EncoderConfig(**SIZES, **settings)
    ids, mask = padded_rows(config)
    segments = np.zeros_like(ids)
    encoder = Encoder(config)
    params = random_params(encoder, (ids, segments, mask), seed=5)
    encoded = jax.jit(encoder.apply)({"params": params}, ids, segments, mask)
    rng = np.random.default_rng(len(family) + len(head))
    kernel = rng.normal(0, 0.5, (config.hidden_size, len(labels))).astype(np.float32)
    bias = rng.normal(0, 0.5, len(labels)).astype(np.float32)
    heads = {"head": head, "num_labels": len(labels), "labels": labels, **record}
    workdir = save_workdir(str(tmp_path / "wd"), {"encoder": params, layer: {
        "kernel": kernel, "bias": bias}}, config, task=f"finetune_{head}", heads=heads,
        tokenizer_dir=tokenizer_dir)
    out = str(tmp_path / "hf")
    code, _, err = run_cli(export, ["--workdir", workdir, "--format", "hf", "--output", out],
                           capsys)
    assert code == 0 and err == "", err
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    architecture = prefix + suffix
    assert saved["architectures"] == [architecture]
    assert saved["id2label"] == {str(i): label for i, label in enumerate(labels)}

    hf_class = getattr(transformers, architecture)
    hf, info = hf_class.from_pretrained(out, attn_implementation="eager",
                                        output_loading_info=True)
    assert not any(info.values()), info
    assert set(load_file(os.path.join(out, hf_files.SAFETENSORS))) <= set(hf.state_dict())
    with torch.no_grad():
        output = hf.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                           attention_mask=torch.tensor(mask))
    sequence, pooled = np.asarray(encoded.sequence), np.asarray(encoded.pooled)
    real = mask.astype(bool)
    if layer == "qa_outputs":
        spans = sequence @ kernel + bias
        np.testing.assert_allclose(output.start_logits.numpy()[real], spans[..., 0][real], **TOL)
        np.testing.assert_allclose(output.end_logits.numpy()[real], spans[..., 1][real], **TOL)
    elif suffix == "ForSequenceClassification":
        np.testing.assert_allclose(output.logits.numpy(), pooled @ kernel + bias, **TOL)
    else:
        np.testing.assert_allclose(output.logits.numpy()[real], (sequence @ kernel + bias)[real],
                                   **TOL)
