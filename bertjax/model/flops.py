"""Model FLOPs of one BERT pretraining step: the numerator of MFU.

Model FLOPs count the matrix multiplications the model needs, at 2 FLOPs per multiply-add,
forward plus backward (3x forward: the backward pass computes gradients for both the inputs and
the weights), each once, however an implementation runs them: rematerialization, elementwise work
(softmax, GELU, LayerNorm), embedding lookups and the optimizer are not counted. This is the MFU
convention of PaLM (Chowdhery et al., 2022, appendix B). For a step on B sequences of T tokens,
with L layers, hidden size H, FFN width I, vocabulary V and P masked positions a sequence:

    encoder matmuls  6 * B*T * L * (4*H*H + 2*H*I)     Q, K, V, attention output; FFN in, out
    attention        12 * B * L * T*T * H               Q.K^T and probs.V, 2*T*T*H each, x3
    DeBERTa terms    12 * L * (R*H*H + B*T*R*H)         the layer's query and key projections
                                                        of the R-row relative table; c2p, p2c
    pooler + NSP     6 * B * (H*H + 2*H)
    MLM head         6 * B*P * (H*H + H*V)              transform + tied projection at the P
                                                        masked positions only
    SBO head         6 * B*P * (3*H*H + H*H + H*V)      (spanbert) two layers + projection
    mask decoder     6 * B * (T*(2*H*H + R*H)            DeBERTa's, n passes of the last layer
                       + n*P*(2*H*H + 2*H*I + 2*T*H + R*H))  on P query rows: keys, values and
                                                        p2c's key products once (the passes
                                                        share them), the rest each pass

The MLM head counts P positions, not T: the task needs scores at the masked positions only, and
that is what this model computes. A model that scores every position (Hugging Face's
`BertForPreTraining`) does more work for the same result, and gets no credit for it here.
"""

from __future__ import annotations

import dataclasses

from bertjax.model.config import EncoderConfig


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """Model FLOPs of one training step (forward + backward), by part."""

    encoder_matmuls: float
    attention: float
    pooler_nsp: float
    mlm_head: float
    sbo_head: float
    mask_decoder: float = 0.0

    @property
    def total(self) -> float:
        return (self.encoder_matmuls + self.attention + self.pooler_nsp + self.mlm_head
                + self.sbo_head + self.mask_decoder)


def train_step_flops(config: EncoderConfig, batch: int, seq_len: int, predictions: int, *,
                     nsp: bool = True, sbo: bool = False, decoder_passes: int = 0) -> StepFlops:
    """The formula of the module docstring, for one optimizer step on `batch` sequences."""
    b, t, p = float(batch), float(seq_len), float(predictions)
    h, i, v, layers = (float(config.hidden_size), float(config.intermediate_size),
                       float(config.vocab_size), float(config.num_layers))
    train = 3.0 * 2.0  # forward + backward, 2 FLOPs per multiply-add
    projection = h * h + h * v
    relative = decoder = 0.0
    if config.position_embedding == "relative":  # DeBERTa's disentangled attention
        rows = float(config.relative_table_size)
        relative = train * 2.0 * layers * (rows * h * h + b * t * rows * h)
        if decoder_passes:
            per_pass = p * (2 * h * h + 2 * h * i + 2 * t * h + rows * h)
            decoder = train * b * (t * (2 * h * h + rows * h) + decoder_passes * per_pass)
    return StepFlops(
        encoder_matmuls=train * b * t * layers * (4 * h * h + 2 * h * i),
        attention=train * 2.0 * b * layers * t * t * h + relative,
        pooler_nsp=train * b * (h * h + (2 * h if nsp else 0.0)),
        mlm_head=train * b * p * projection,
        sbo_head=train * b * p * (3 * h * h + projection) if sbo else 0.0,
        mask_decoder=decoder)
