"""BERT-base pretraining as in Devlin et al. (2019): MLM + NSP, 1M steps of 256 sequences,
128 tokens for 90% of the steps and 512 for the rest, AdamW at 1e-4 with 10k warmup steps.

Every other pretraining config imports this one and changes only what differs.

    python -m bertjax.main --config=configs/base.py --workdir=DIR \
        --config.data.input='corpus/*.txt' --config.train.batch_size=256
"""

import ml_collections

from configs import _sections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "pretrain"
    # Start from another run's parameters: a pretraining workdir or a converted HF checkpoint.
    config.init_checkpoint = ""
    # bert: MLM + NSP; roberta: MLM only, full sentences; spanbert: span masking, MLM + SBO;
    # electra: replaced token detection (configs/electra.py).
    config.objective = "bert"
    # objective=electra only: the generator and the weight of its discriminator's loss.
    config.electra = _electra()
    # The model's shape and numerics (configs/_sections.py): a preset, sizes, dtypes, dropout.
    config.model = _sections.model(preset="base")
    config.data = _data()
    config.masking = _masking()
    config.schedule = _schedule()
    config.train = _train()
    # AdamW with linear decay, weight decay 0.01 and clipping at 1.0 (configs/_sections.py).
    config.optimizer = _sections.optimizer(learning_rate=1e-4, warmup_steps=10_000, eps=1e-6,
                                           bias_correction=False)  # BERT's optimizer had none
    config.mesh = _sections.mesh()  # (data, fsdp, tensor) sizes; data -1: the remaining devices
    return config


def _electra() -> ml_collections.ConfigDict:
    """objective=electra only: the generator and the weight of its discriminator's loss."""
    section = ml_collections.ConfigDict()
    # 0: the paper's generator, a quarter of the discriminator's hidden size, its depth, one
    # attention head per 64 dimensions and a feed-forward 4x its width.
    section.generator_hidden_size = 0
    section.generator_num_layers = 0
    section.generator_num_heads = 0
    section.generator_intermediate_size = 0
    section.generator_vocab_size = 0   # 0: the discriminator's (they share embeddings)
    section.discriminator_weight = 50.0  # lambda
    return section


def _data() -> ml_collections.ConfigDict:
    """The raw text, how it is read and tokenized, and the prepared corpus."""
    section = ml_collections.ConfigDict()
    # Raw text: files, directories or globs (comma-separated; .gz/.bz2 fine), or "tfds:NAME".
    section.input = ""
    # "sentences": one sentence a line, blank line between documents (google-research/bert);
    # "paragraphs": one paragraph a line, split into sentences; "mediawiki": a Wikipedia XML dump.
    section.input_format = "sentences"
    # Where the prepared corpus lives; empty means WORKDIR/data.
    section.prepared = ""
    # An existing vocabulary (vocab.txt, spm .model, or a tokenizer directory); empty trains one.
    section.tokenizer = ""
    section.tokenizer_type = "wordpiece"  # wordpiece | sentencepiece | bpe (when training one)
    section.vocab_size = 30522
    section.lowercase = True
    section.short_seq_prob = 0.1
    # objective roberta: keep the documents packed into a row apart (each attends to itself only,
    # positions restart), as ModernBERT packs; False is RoBERTa's, attending across them.
    section.separate_documents = False
    section.eval_fraction = 0.01        # documents held out for evaluation
    section.workers = 2                 # background batch builders
    section.prefetch = 4                # batches built ahead of the step
    return section


def _masking() -> ml_collections.ConfigDict:
    """Which tokens are predicted and what replaces them."""
    section = ml_collections.ConfigDict()
    section.strategy = "token"       # token | whole_word | span
    section.mask_prob = 0.15
    section.mask_token_prob = 0.8
    section.random_token_prob = 0.1
    section.random_token_source = "uniform"  # uniform | unigram
    section.span_geometric_p = 0.2
    section.max_span_length = 10
    return section


def _schedule() -> ml_collections.ConfigDict:
    """The BERT length schedule: short sequences first, long ones for the last `long_fraction`."""
    section = ml_collections.ConfigDict()
    section.short_seq_len = 128
    section.short_max_predictions = 20
    section.long_seq_len = 512
    section.long_max_predictions = 80
    section.long_fraction = 0.1
    # model.position_embedding=rope: the global layers' rotary base in the short phase (0: the
    # model's, model.rope_theta, which the long phase and the trained model use).
    section.short_rope_theta = 0.0
    return section


def _train() -> ml_collections.ConfigDict:
    """Steps, batch, logging, checkpoints, evaluation and the time budget."""
    section = ml_collections.ConfigDict()
    section.steps = 1_000_000
    section.batch_size = 256           # global, across all devices and hosts
    section.accumulation_steps = 1
    section.seed = 0
    section.log_every = 100
    section.checkpoint_every = 10_000
    section.keep_checkpoints = 3
    section.eval_every = 10_000
    section.eval_batches = 20
    section.plot = False               # loss/accuracy curves to WORKDIR/curves.png
    # Minutes of wall time to train for (0: train.steps decides). The learning-rate schedule is
    # then laid over the budget, train.steps is a cap, and the run checkpoints and stops once it
    # is spent (bertjax/train/time_budget.py; configs/budget.py).
    section.time_budget_minutes = 0.0
    # A checkpoint every so many minutes of wall time too (0: only every checkpoint_every steps).
    section.checkpoint_every_minutes = 0.0
    # Texts with [MASK] ("|" between them) the finished run fills in, top 5 each, on stderr.
    section.fill_mask_examples = ""
    # GiB one device holds, checked against the compiled step before the first step; 0 asks the
    # device (TPUs and GPUs report it, CPUs do not). Set it lower to keep headroom.
    section.device_memory_gb = 0.0
    return section
