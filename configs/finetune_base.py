"""Shared fine-tuning defaults (Devlin et al., 2019, appendix A.3): AdamW with bias correction,
learning rate 3e-5 with 10% linear warmup then linear decay, 3 epochs, batch 32, 128 tokens,
evaluation (and a checkpoint) at every epoch end, the best dev checkpoint kept.

Every configs/finetune_*.py imports this and sets the task and its data:

    python -m bertjax.main --config=configs/finetune_sentiment.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED

PRETRAINED is a pretraining workdir, a params export, or `python -m bertjax.convert --from-hf`
output; the model's shape, vocabulary and tokenizer come from it (model.preset=from_checkpoint).
Only its encoder (pooler included) is loaded; the task head starts fresh.

What a step computes is transformers' (BertFor*Classification + the Trainer's AdamW, schedule and
clipping) to fp32 rounding, from the same weights and batch (tests/test_training_parity.py);
benchmarks/finetune_parity.py compares accuracies. Where the two frameworks' defaults differ:
- Adam epsilon 1e-8, torch's and the Trainer's. BERT's TensorFlow optimizer used 1e-6, which is
  not small next to clipped fine-tuning gradients: in MiniLM's first 10 steps on movie reviews it
  shrank the updates by ~8% on the layer kernels and ~23% on the word embeddings.
- Bias-corrected AdamW (torch's; BERT's pretraining optimizer had no correction), global-norm
  clipping at 1.0 (the Trainer's max_grad_norm), decoupled weight decay on kernels and
  embeddings only: the Trainer's groups (no decay on biases and LayerNorm weights).
- Warmup: ceil(warmup_fraction x steps) steps, rounded up as the Trainer does; linear from 0, so
  the first update applies rate 0 in both frameworks (it only seeds Adam's moments), then linear
  decay from the peak to 0 after the last step.
- The recipe itself is Devlin et al.'s, not the Trainer's defaults (lr 5e-5, batch 8, no warmup,
  no weight decay): set both alike when comparing.
- The new classifier: kernel normal(initializer_range of the checkpoint), zero bias, after dropout
  at hidden_dropout on the pooled output (the Trainer's classifier_dropout=None); the checkpoint's
  pooler is loaded when it was trained (NSP) and decays like any kernel, as in transformers.
- Rows are padded to data.max_seq_len (static shapes; the mask makes this identical to
  transformers' per-batch padding, only slower) and truncated longest-first with [CLS] and [SEP]
  counted, as the tokenizer's truncation=True.
- Every epoch is a fresh permutation of (seed, epoch), every example once; the last batch is
  short (completed with zero-weight rows, its loss averaged over its real rows), as the Trainer's
  sampler without drop_last. The orders differ from torch's, so results match per seed only in
  distribution.
- Evaluation at every epoch end keeps the best epoch's checkpoint (chosen on the dev set: its
  score is optimistic); the Trainer by default reports the last epoch.
"""

import ml_collections

from bertjax.settings.defaults import section
from bertjax.settings.finetune_sections import FinetuneData, FinetuneOptions, TrainSettings
from bertjax.settings.shared import FROM_CHECKPOINT, MeshSettings, ModelSpec
from bertjax.train.optimizer import OptimizerConfig


def get_config() -> ml_collections.ConfigDict:
    """Each section is built from the dataclass it is read into, which gives every key its
    default, its meaning and its check (bertjax/settings/finetune_sections.py for the fine-tuning
    sections)."""
    config = ml_collections.ConfigDict()
    # finetune_classification (one sentence or a pair) | finetune_regression |
    # finetune_token_classification | finetune_span_classification | finetune_qa |
    # finetune_retrieval
    config.task = "finetune_classification"
    config.mode = "train"                   # train | predict
    config.init_checkpoint = ""
    # predict mode: where predictions go (default WORKDIR/predictions.jsonl, .json for QA).
    config.predict_output = ""

    # from_checkpoint: shape and vocabulary of init_checkpoint; a preset name (tiny .. large)
    # trains from scratch (then data.tokenizer is required). The rest as in pretraining
    # (ModelSpec, bertjax/settings/shared.py); hidden_dropout is also the dropout before the
    # classifier.
    config.model = section(ModelSpec, preset=FROM_CHECKPOINT)
    config.finetune = section(FinetuneOptions)  # what trains; the heads' options
    config.data = section(FinetuneData)  # files, columns, labels, lengths
    config.train = section(TrainSettings)  # 3 epochs of batch 32, the best epoch kept
    # AdamW with linear decay, weight decay 0.01 and clipping at 1.0 (OptimizerConfig,
    # bertjax/train/optimizer.py); eps 1e-8 is torch's and the Trainer's (see above), bias
    # correction as in torch, and the warmup a fraction of all steps (rounded up).
    config.optimizer = section(OptimizerConfig, skip=("total_steps", "warmup_steps"),
                               learning_rate=3e-5, eps=1e-8, bias_correction=True)
    config.optimizer.warmup_fraction = 0.1
    config.mesh = section(MeshSettings)  # (data, fsdp, tensor) sizes; data -1: the other devices
    return config
