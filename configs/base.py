"""BERT-base pretraining as in Devlin et al. (2019): MLM + NSP, 1M steps of 256 sequences,
128 tokens for 90% of the steps and 512 for the rest, AdamW at 1e-4 with 10k warmup steps.

Every other pretraining config imports this one and changes only what differs.

    python -m bertjax.main --config=configs/base.py --workdir=DIR \
        --config.data.input='corpus/*.txt' --config.train.batch_size=256
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "pretrain"
    # Start from another run's parameters: a pretraining workdir or a converted HF checkpoint.
    config.init_checkpoint = ""
    # bert: MLM + NSP; roberta: MLM only, full sentences; spanbert: span masking, MLM + SBO.
    config.objective = "bert"

    config.model = ml_collections.ConfigDict()
    # tiny | mini | small | medium | base | large, or from_checkpoint: the shape and vocabulary
    # of config.init_checkpoint (e.g. a `python -m bertjax.convert --from-hf` output).
    config.model.preset = "base"
    # 0 keeps the preset's size; set any of these to change one dimension of it.
    config.model.num_layers = 0
    config.model.hidden_size = 0
    config.model.num_heads = 0
    config.model.intermediate_size = 0
    config.model.dtype = "float32"          # compute dtype; "bfloat16" on accelerators
    config.model.param_dtype = "float32"
    config.model.hidden_dropout = 0.1
    config.model.attention_dropout = 0.1
    # "" lets the backend choose jax.nn.dot_product_attention's kernel (used whenever attention
    # dropout is 0, and at inference); "cudnn": cuDNN flash attention on a GPU, with bf16.
    config.model.attention_implementation = ""
    # "bfloat16" with dtype float32: bf16 matmul operands, fp32 results and everything else
    # (README "Speed": 1.16x on a BERT-base pretraining step on a CPU with AVX512-BF16). "" = dtype.
    config.model.matmul_dtype = ""
    config.model.scan_layers = True
    config.model.remat = "none"             # none | full | save_dots
    config.model.max_position_embeddings = 512
    config.model.type_vocab_size = 2

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
    config.data.tokenizer_type = "wordpiece"  # wordpiece | sentencepiece (when training one)
    config.data.vocab_size = 30522
    config.data.lowercase = True
    config.data.short_seq_prob = 0.1
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
    # GiB one device holds, checked against the compiled step before the first step; 0 asks the
    # device (TPUs and GPUs report it, CPUs do not). Set it lower to keep headroom.
    config.train.device_memory_gb = 0.0

    config.optimizer = ml_collections.ConfigDict()
    config.optimizer.name = "adamw"         # adamw | lamb
    config.optimizer.learning_rate = 1e-4
    config.optimizer.warmup_steps = 10_000
    config.optimizer.decay = "linear"       # linear | cosine | constant
    config.optimizer.end_learning_rate = 0.0
    config.optimizer.b1 = 0.9
    config.optimizer.b2 = 0.999
    config.optimizer.eps = 1e-6
    config.optimizer.weight_decay = 0.01
    config.optimizer.bias_correction = False  # the original BERT optimizer had none
    config.optimizer.clip_norm = 1.0          # global norm; 0 disables

    # Device mesh: sizes of the (data, fsdp, tensor) axes; one may be -1 (all remaining devices).
    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = -1
    config.mesh.fsdp = 1
    config.mesh.tensor = 1
    return config
