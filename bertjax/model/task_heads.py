"""Fine-tuning heads on the encoder, with Hugging Face's parameter layout (a contract with export):

    SequenceClassifier  {"encoder", "classifier": {"kernel" [H, C], "bias" [C]}}
                        pooled output -> dropout -> dense (BertForSequenceClassification;
                        regression is C = 1); with `prompt_length` also "soft_prompt" and a
                        frozen encoder (bertjax.model.prompting); packed rows (a batch with
                        `starts`): the same head on each packed sequence's own [CLS]
    TokenClassifier     {"encoder", "classifier": {"kernel" [H, C], "bias" [C]}
                         (+ "crf": {"transitions" [C, C], "start_transitions" [C],
                                    "end_transitions" [C]})}
                        sequence output -> dropout -> dense (BertForTokenClassification)
    SpanExtractor       {"encoder", "qa_outputs": {"kernel" [H, 2], "bias" [2]}}
                        index 0 = start, 1 = end (BertForQuestionAnswering)

Models take the batch dict and `deterministic`, like BertForPretraining, and return fp32 outputs.
With `freeze_encoder` the encoder runs deterministically under stop_gradient (feature-based
fine-tuning: no gradient flows into it; the optimizer also leaves its parameters untouched).
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import crf, prompting
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder, EncoderOutput
from bertjax.model.primitives import dense, zeros_init

Array = jax.Array
# Logits outside the context: finite (no NaN from a row without any context token), and far below
# any real score.
MASKED_LOGIT = -1e9


def _encode(config: EncoderConfig, batch: Mapping[str, Array], deterministic: bool,
            frozen: bool) -> EncoderOutput:
    # Packed rows (bertjax.finetune.packing) carry positions, pack ids and each sequence's start.
    encoded = Encoder(config, name="encoder")(
        batch["input_ids"], batch["segment_ids"], batch["input_mask"],
        deterministic=deterministic or frozen, positions=batch.get("positions"),
        pack_ids=batch.get("pack_ids"), pool_positions=batch.get("starts"))
    return jax.lax.stop_gradient(encoded) if frozen else encoded


def _head(config: EncoderConfig, features: int, name: str) -> nn.Dense:
    # fp32: a handful of outputs, negligible cost, and the loss sees them directly.
    return dense(config, features, ("embed", None), name, dtype="float32")


class SequenceClassifier(nn.Module):
    """Outputs `logits` [B, C] (C = 1: regression scores); [B, S, C] for packed rows (a
    `starts` [B, S] in the batch, bertjax.finetune.packing), one per sequence slot."""

    config: EncoderConfig
    num_labels: int
    freeze_encoder: bool = False
    prompt_length: int = 0

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg = self.config
        if self.prompt_length:  # the settings refuse packing with a soft prompt
            pooled = prompting.encode(cfg, batch, deterministic, self.prompt_length)[0].pooled
        else:
            pooled = _encode(cfg, batch, deterministic, self.freeze_encoder).pooled
        pooled = nn.Dropout(cfg.hidden_dropout)(pooled, deterministic=deterministic)
        return {"logits": _head(cfg, self.num_labels, "classifier")(pooled.astype(jnp.float32))}


class ChainCRF(nn.Module):
    """The CRF's parameters; `__call__` returns them for the loss and the decoder."""

    num_labels: int

    @nn.compact
    def __call__(self) -> dict[str, Array]:
        c = self.num_labels
        return {"transitions": self.param("transitions", zeros_init((None, None)), (c, c)),
                "start_transitions": self.param("start_transitions", zeros_init((None,)), (c,)),
                "end_transitions": self.param("end_transitions", zeros_init((None,)), (c,))}


class TokenClassifier(nn.Module):
    """Outputs `logits` [B, L, C]; deterministic calls also `tags` [B, L] (argmax, or Viterbi
    over `label_mask` with the CRF); with the CRF, `crf` holds its parameters for the loss."""

    config: EncoderConfig
    num_labels: int
    use_crf: bool = False
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg = self.config
        encoded = _encode(cfg, batch, deterministic, self.freeze_encoder)
        hidden = nn.Dropout(cfg.hidden_dropout)(encoded.sequence, deterministic=deterministic)
        logits = _head(cfg, self.num_labels, "classifier")(hidden.astype(jnp.float32))
        outputs = {"logits": logits}
        if self.use_crf:
            outputs["crf"] = ChainCRF(self.num_labels, name="crf")()
        if deterministic:
            if self.use_crf:
                p = outputs["crf"]
                outputs["tags"] = crf.viterbi_decode(
                    logits, batch["label_mask"], p["transitions"], p["start_transitions"],
                    p["end_transitions"])
            else:
                outputs["tags"] = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return outputs


class SpanExtractor(nn.Module):
    """Outputs `start_logits` and `end_logits` [B, L], MASKED_LOGIT outside `context_mask`."""

    config: EncoderConfig
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg = self.config
        encoded = _encode(cfg, batch, deterministic, self.freeze_encoder)
        logits = _head(cfg, 2, "qa_outputs")(encoded.sequence.astype(jnp.float32))
        inside = batch["context_mask"].astype(bool)
        logits = jnp.where(inside[..., None], logits, MASKED_LOGIT)
        return {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
