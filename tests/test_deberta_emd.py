"""DeBERTa's enhanced mask decoder (model.enhanced_mask_decoder): bertjax's decoder, gathered at
the masked positions, computes what transformers' last DebertaV2Layer computes when called twice
with query_states (the outside oracle: Microsoft's emd_context_layer, over every position); a
tiny configs/deberta.py run with the decoder trains, resumes exactly and exports its encoder as
DebertaV2Model; settings the decoder cannot honour are refused before the workdir exists.
"""

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import DebertaV2Model

from bertjax.cli import convert, export
from bertjax.inference import loading
from bertjax.model.config import preset
from bertjax.model.enhanced_mask_decoder import EnhancedMaskDecoder
from bertjax.model.flops import train_step_flops
from bertjax.model.heads import BertForPretraining
import cli_in_process
from cli_checks import assert_one_line_error, run_cli
from pretrain_runs import run_child
from test_deberta import TOL, at_tokens, deberta_args, hf_dirs, padded_batch  # noqa: F401
from test_pretrain import logged
from trees import flat

pytestmark = pytest.mark.slow

PASSES = 2
# Per row: masked positions among its real tokens (rows of 40, 23 and 9), the last slot padding.
MASKED = np.array([[3, 17, 26, 39, 0], [1, 9, 12, 22, 0], [2, 4, 5, 8, 0]], np.int32)


def transformers_decoder(hf, table, ids, mask):
    """Microsoft's emd_context_layer on transformers' model: the last layer twice, its keys and
    values the last layer's input, its queries hidden + table[position] and then its own output.
    Returns the query states at every position [B, L, H] and the MLM scores [B, L, V]."""
    encoder = hf.deberta.encoder
    with torch.no_grad():
        out = hf.deberta(input_ids=torch.tensor(ids, dtype=torch.long),
                         attention_mask=torch.tensor(mask), output_hidden_states=True)
        hidden = out.hidden_states[-2]
        attention_mask = encoder.get_attention_mask(torch.tensor(mask))
        relative_pos = encoder.get_rel_pos(hidden)
        rel_embeddings = encoder.get_rel_embedding()
        query = hidden + torch.tensor(table)[None, :ids.shape[1]]
        for _ in range(PASSES):
            query, _ = encoder.layer[-1](hidden, attention_mask, query_states=query,
                                         relative_pos=relative_pos,
                                         rel_embeddings=rel_embeddings)
        logits = hf.lm_predictions(query, hf.deberta.embeddings.word_embeddings)
    return query.numpy(), logits.numpy()


def bertjax_decoder(params, config, ids, mask):
    """(the decoder's query states [B, P, H], the MLM scores [B, P, V]) at MASKED."""
    model = BertForPretraining(config, nsp=False, enhanced_mask_decoder=PASSES)
    batch = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
             "masked_positions": MASKED}

    def forward(p, b):
        return model.apply({"params": p}, b, capture_intermediates=lambda module, _: isinstance(
            module, EnhancedMaskDecoder))

    outputs, state = jax.jit(forward)(params, {k: jnp.asarray(v) for k, v in batch.items()})
    (states,) = state["intermediates"]["emd"]["__call__"]
    return np.asarray(states), np.asarray(outputs["mlm_logits"])


@pytest.mark.parametrize("scan", [True, False])
def test_the_decoder_computes_transformers_last_layer_with_query_states(hf_dirs, tmp_path,
                                                                        scan):
    hf, directory = hf_dirs["v3"]
    out = str(tmp_path / "ours")
    convert.main(["--from-hf", directory, "--output", out] + ([] if scan else
                                                               ["--no-scan-layers"]))
    bundle = loading.load(out)
    config = bundle.encoder
    assert config.scan_layers == scan and config.position_buckets == 8
    table = np.random.default_rng(11).normal(0.0, 0.5, (config.max_position_embeddings,
                                                        config.hidden_size)).astype(np.float32)
    params = {**bundle.params, "emd": {"positions": table}}
    ids, mask, _ = padded_batch(seed=5)
    states, logits = bertjax_decoder(params, config, ids, mask)
    hf_states, hf_logits = transformers_decoder(hf, table, ids, mask)
    rows = np.arange(len(ids))[:, None]
    hf_states, hf_logits = hf_states[rows, MASKED], hf_logits[rows, MASKED]
    print(f"max |ours - transformers|: decoder states {np.abs(states - hf_states).max():.2e}, "
          f"MLM logits {np.abs(logits - hf_logits).max():.2e}")
    np.testing.assert_allclose(states, hf_states, **TOL)
    np.testing.assert_allclose(logits, hf_logits, **TOL)
    assert np.abs(hf_logits).max() > 1.0
    # Not the last layer's own output there: the decoder changed the MLM head's input.
    _, plain = hf_outputs_at(hf, ids, mask)
    assert np.abs(plain - hf_logits).max() > 0.1


def hf_outputs_at(hf, ids, mask):
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask)).logits.numpy()
    return None, logits[np.arange(len(ids))[:, None], MASKED]


def test_the_decoder_counts_in_the_model_flops():
    model = preset("base", vocab_size=128_000, position_embedding="relative")
    without = train_step_flops(model, 8, 512, 77, nsp=False)
    with_decoder = train_step_flops(model, 8, 512, 77, nsp=False, decoder_passes=2)
    assert without.mask_decoder == 0.0
    assert with_decoder.total - without.total == with_decoder.mask_decoder > 0.0
    # Two passes over 77 query rows cost far less than one more layer over 512 rows.
    one_layer = (without.encoder_matmuls + without.attention) / model.num_layers
    print(f"decoder {with_decoder.mask_decoder:.3e} FLOPs, one layer {one_layer:.3e}")
    assert with_decoder.mask_decoder < one_layer
