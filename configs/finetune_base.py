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
from bertjax.settings.shared import FROM_CHECKPOINT, MeshSettings, ModelSpec
from bertjax.train.optimizer import OptimizerConfig


def get_config() -> ml_collections.ConfigDict:
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

    config.finetune = ml_collections.ConfigDict()
    config.finetune.reinit_top_layers = 0   # re-initialize the top k encoder layers (+ pooler)
    config.finetune.freeze_encoder = False  # feature-based: train the head only
    config.finetune.crf = False             # token classification: a linear-chain CRF
    config.finetune.label_all_subwords = True  # token classification: else first subword only
    # What trains (bertjax/finetune/methods.py): full | adapter | lora | cloze | soft_prompt
    config.finetune.method = "full"
    config.finetune.adapter_size = 64       # adapter: bottleneck width
    config.finetune.lora_rank = 8           # lora: rank, scale alpha / rank, dropout on its input
    config.finetune.lora_alpha = 16.0
    config.finetune.lora_dropout = 0.0
    config.finetune.prompt_length = 20      # soft_prompt: trainable vectors after [CLS]
    # cloze (and soft_prompt given a verbalizer): one [MASK], {text} (and {text_pair}) filled in
    config.finetune.template = "{text} It was [MASK]."
    config.finetune.verbalizer = ""         # "label:word,..." (one vocabulary token each)
    # span classification and QA's span scorer: mean | attention (a learned score per token)
    config.finetune.span_pooling = "mean"
    # QA: start_end (BERT's start + end logits) | span (an MLP over every candidate span)
    config.finetune.qa_scorer = "start_end"
    config.finetune.pooling = "mean"        # retrieval: mean | cls of the last layer
    config.finetune.separate_encoders = False  # retrieval: a document encoder of its own
    config.finetune.temperature = 0.05      # retrieval: softmax over cosine / temperature

    config.data = ml_collections.ConfigDict()
    # Files (or packaged:NAME:SPLIT, tfds:NAME:SPLIT); eval picks the best checkpoint.
    config.data.train = ""
    config.data.eval = ""
    config.data.predict = ""
    config.data.format = ""                 # tsv | csv | jsonl | conll | squad; empty: extension
    config.data.text_column = "sentence"
    config.data.text_pair_column = ""       # e.g. sentence2 for a pair task
    config.data.label_column = "label"
    config.data.id_column = ""              # empty: row numbers
    config.data.negative_column = ""        # retrieval: a hard negative document; empty: none
    # span classification: the span's character offsets in the text (end exclusive)
    config.data.span_start_column = "start"
    config.data.span_end_column = "end"
    # Comma-separated label order (ids); empty: the training set's labels sorted (a TFDS
    # ClassLabel's own name order for tfds: sources).
    config.data.labels = ""
    # Binary classification: the label whose F1 is reported (one of the labels); empty: the
    # second label of the order ("1" for labels 0,1; "equivalent" for tfds:glue/mrpc).
    config.data.positive_label = ""
    config.data.tokenizer = ""              # empty: the init checkpoint's
    config.data.max_seq_len = 128
    config.data.max_train_examples = 0      # 0: all
    config.data.max_train_examples_per_class = 0  # few-shot: a fixed k per label; 0: all
    config.data.max_eval_examples = 0
    config.data.doc_stride = 128            # QA
    config.data.max_query_length = 64       # QA; retrieval: the query rows' length
    config.data.max_answer_length = 30      # QA
    config.data.tfds_data_dir = ""

    config.train = ml_collections.ConfigDict()
    config.train.epochs = 3                 # 0 (steps 0): evaluate the start only (zero-shot)
    config.train.steps = 0                  # 0: epochs x steps per epoch
    config.train.batch_size = 32            # global
    config.train.eval_batch_size = 0        # 0: batch_size
    # Each batch cut to the smallest multiple of this many tokens that holds its longest row
    # (one compiled step per length; training batches drawn from length-sorted windows of the
    # shuffled epoch); 0: every batch padded to max_seq_len.
    config.train.bucket_multiple = 32      # bertjax.core.length_buckets.DEFAULT_MULTIPLE
    # Sentence (pair) classification and regression: each training row of max_seq_len tokens
    # packs as many whole sequences as fit, each attending only to itself (bertjax/finetune/
    # packing.py), so short sentences stop paying for padding; batch_size then counts packed
    # rows (fewer steps an epoch). Evaluation and prediction stay unpacked (length-bucketed).
    config.train.packing = False
    config.train.accumulation_steps = 1
    config.train.seed = 0
    config.train.restarts = 1               # N > 1: N seeds in WORKDIR/restart_K, best kept
    config.train.main_metric = ""           # what picks the best checkpoint; empty: task default
    config.train.log_every = 50
    config.train.checkpoint_every = 0       # extra mid-epoch checkpoints; 0: epoch ends only

    # AdamW with linear decay, weight decay 0.01 and clipping at 1.0 (OptimizerConfig,
    # bertjax/train/optimizer.py); eps 1e-8 is torch's and the Trainer's (see above), bias
    # correction as in torch, and the warmup a fraction of all steps (rounded up).
    config.optimizer = section(OptimizerConfig, skip=("total_steps", "warmup_steps"),
                               learning_rate=3e-5, eps=1e-8, bias_correction=True)
    config.optimizer.warmup_fraction = 0.1
    config.mesh = section(MeshSettings)  # (data, fsdp, tensor) sizes; data -1: the other devices
    return config
