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
    config.electra = ml_collections.ConfigDict()
    # 0: the paper's generator, a quarter of the discriminator's hidden size, its depth, one
    # attention head per 64 dimensions and a feed-forward 4x its width.
    config.electra.generator_hidden_size = 0
    config.electra.generator_num_layers = 0
    config.electra.generator_num_heads = 0
    config.electra.generator_intermediate_size = 0
    config.electra.generator_vocab_size = 0   # 0: the discriminator's (they share embeddings)
    config.electra.discriminator_weight = 50.0  # lambda

    # The model's shape and numerics (configs/_sections.py): a preset, sizes, dtypes, dropout.
    config.model = _sections.model(preset="base")

    config.data = ml_collections.ConfigDict()
    # Raw text: files, directories or globs (comma-separated; .gz/.bz2 fine), or "tfds:NAME".
    config.data.input = ""
    # "sentences": one sentence a line, blank line between documents (google-research/bert);
    # "paragraphs": one paragraph a line, split into sentences; "mediawiki": a Wikipedia XML dump.
    config.data.input_format = "sentences"
    # Where the prepared corpus lives; empty means WORKDIR/data.
    config.data.prepared = ""
    # An existing vocabulary (vocab.txt, spm .model, or a tokenizer directory); empty trains one.
    config.data.tokenizer = ""
    config.data.tokenizer_type = "wordpiece"  # wordpiece | sentencepiece | bpe (when training one)
    config.data.vocab_size = 30522
    config.data.lowercase = True
    config.data.short_seq_prob = 0.1
    # objective roberta: keep the documents packed into a row apart (each attends to itself only,
    # positions restart), as ModernBERT packs; False is RoBERTa's, attending across them.
    config.data.separate_documents = False
    config.data.eval_fraction = 0.01        # documents held out for evaluation
    config.data.workers = 2                 # background batch builders
    config.data.prefetch = 4                # batches built ahead of the step

    config.masking = ml_collections.ConfigDict()
    config.masking.strategy = "token"       # token | whole_word | span
    config.masking.mask_prob = 0.15
    config.masking.mask_token_prob = 0.8
    config.masking.random_token_prob = 0.1
    config.masking.random_token_source = "uniform"  # uniform | unigram
    config.masking.span_geometric_p = 0.2
    config.masking.max_span_length = 10

    # The BERT length schedule: short sequences first, long ones for the last `long_fraction`.
    config.schedule = ml_collections.ConfigDict()
    config.schedule.short_seq_len = 128
    config.schedule.short_max_predictions = 20
    config.schedule.long_seq_len = 512
    config.schedule.long_max_predictions = 80
    config.schedule.long_fraction = 0.1
    # model.position_embedding=rope: the global layers' rotary base in the short phase (0: the
    # model's, model.rope_theta, which the long phase and the trained model use).
    config.schedule.short_rope_theta = 0.0

    config.train = ml_collections.ConfigDict()
    config.train.steps = 1_000_000
    config.train.batch_size = 256           # global, across all devices and hosts
    config.train.accumulation_steps = 1
    config.train.seed = 0
    config.train.log_every = 100
    config.train.checkpoint_every = 10_000
    config.train.keep_checkpoints = 3
    config.train.eval_every = 10_000
    config.train.eval_batches = 20
    config.train.plot = False               # loss/accuracy curves to WORKDIR/curves.png
    # Minutes of wall time to train for (0: train.steps decides). The learning-rate schedule is
    # then laid over the budget, train.steps is a cap, and the run checkpoints and stops once it
    # is spent (bertjax/train/time_budget.py; configs/budget.py).
    config.train.time_budget_minutes = 0.0
    # A checkpoint every so many minutes of wall time too (0: only every checkpoint_every steps).
    config.train.checkpoint_every_minutes = 0.0
    # Texts with [MASK] ("|" between them) the finished run fills in, top 5 each, on stderr.
    config.train.fill_mask_examples = ""
    # GiB one device holds, checked against the compiled step before the first step; 0 asks the
    # device (TPUs and GPUs report it, CPUs do not). Set it lower to keep headroom.
    config.train.device_memory_gb = 0.0

    # AdamW with linear decay, weight decay 0.01 and clipping at 1.0 (configs/_sections.py).
    config.optimizer = _sections.optimizer(learning_rate=1e-4, warmup_steps=10_000, eps=1e-6,
                                           bias_correction=False)  # BERT's optimizer had none
    config.mesh = _sections.mesh()  # (data, fsdp, tensor) sizes; data -1: the remaining devices
    return config
