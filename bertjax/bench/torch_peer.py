"""The peer: Hugging Face transformers' PyTorch `BertForPreTraining`, as its users train it.

Same size, batch, length and masked positions as our step; random init; fp32 (or bf16 autocast)
on the CPU, or on the GPU when our step runs on one, so that both use the same hardware. One step
is forward with MLM and NSP labels, backward, gradient clipping (when the config clips) and an
AdamW update. It computes MLM scores at every position and takes the loss where the
label is not -100: that is the library's own pretraining head, so that is what is timed.
"""

from __future__ import annotations

import os

import numpy as np

from bertjax.core import extras
from bertjax.core.errors import UserError
from bertjax.model.config import EncoderConfig


def cpu_threads() -> int:
    """The cores this process may run on (the machine's, unless restricted by affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def check_objective(name: str) -> None:
    if name != "bert":
        raise UserError(f"--compare-torch times BertForPreTraining (MLM + NSP), the peer of "
                        f"objective 'bert', not {name!r}")


def peer_libraries():
    """(torch, transformers), the hf extra: heavy, and loaded only for --compare-torch."""
    return (extras.require("torch", "hf", "--compare-torch"),
            extras.require("transformers", "hf", "--compare-torch"))


def hf_config(encoder: EncoderConfig, **extra):
    """transformers' BertConfig of the same shape and dropout as `encoder`."""
    _, transformers = peer_libraries()
    return transformers.BertConfig(
        vocab_size=encoder.vocab_size, hidden_size=encoder.hidden_size,
        num_hidden_layers=encoder.num_layers, num_attention_heads=encoder.num_heads,
        intermediate_size=encoder.intermediate_size, hidden_act="gelu",
        hidden_dropout_prob=encoder.hidden_dropout,
        attention_probs_dropout_prob=encoder.attention_dropout,
        max_position_embeddings=encoder.max_position_embeddings,
        type_vocab_size=encoder.type_vocab_size, layer_norm_eps=encoder.layer_norm_eps,
        initializer_range=encoder.initializer_range, pad_token_id=encoder.pad_token_id, **extra)


class TorchStep:
    """Builds transformers' model and AdamW; `step()` runs one update to completion.

    `batch` is our step's batch of objective 'bert' (numpy, with `nsp_label`).
    """

    def __init__(self, encoder: EncoderConfig, batch: dict[str, np.ndarray], *,
                 learning_rate: float, weight_decay: float, betas: tuple[float, float],
                 eps: float, clip_norm: float, seed: int = 0, bf16: bool = False,
                 device: str = "cpu"):
        torch, transformers = peer_libraries()
        if device == "cuda" and not torch.cuda.is_available():
            raise UserError("our step runs on a GPU but this torch sees none; the peer would "
                            "be timed on other hardware")
        self.threads = cpu_threads()
        torch.set_num_threads(self.threads)
        torch.manual_seed(seed)
        self._torch = torch
        self.device = device
        self.versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        self.model = transformers.BertForPreTraining(hf_config(encoder)).train().to(device)
        self.bf16 = bf16  # torch.autocast(device, dtype=torch.bfloat16) around the forward
        self.attention = str(self.model.config._attn_implementation)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=learning_rate,
                                           betas=betas, eps=eps, weight_decay=weight_decay)
        self.clip_norm = clip_norm
        self.inputs = {k: v.to(device) for k, v in _hf_inputs(torch, batch).items()}
        self.loss: float | None = None

    def step(self) -> None:
        with self._torch.autocast(self.device, dtype=self._torch.bfloat16, enabled=self.bf16):
            loss = self.model(**self.inputs).loss
        loss.backward()
        if self.clip_norm > 0:
            self._torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss = float(loss.detach().float())  # waits for the device: the step is complete

    def last_loss(self) -> float:
        return float("nan") if self.loss is None else self.loss


def _hf_inputs(torch, batch: dict[str, np.ndarray]) -> dict:
    """Our batch schema -> BertForPreTraining's arguments (labels -100 except at masked slots)."""
    ids = batch["input_ids"]
    labels = np.full(ids.shape, -100, np.int64)
    rows = np.arange(ids.shape[0])[:, None]
    used = batch["masked_weights"] > 0
    labels[np.broadcast_to(rows, used.shape)[used], batch["masked_positions"][used]] = (
        batch["masked_ids"][used])

    def tensor(x):
        return torch.from_numpy(np.asarray(x, np.int64))

    return {"input_ids": tensor(ids), "token_type_ids": tensor(batch["segment_ids"]),
            "attention_mask": tensor(batch["input_mask"]), "labels": tensor(labels),
            "next_sentence_label": tensor(batch["nsp_label"])}
