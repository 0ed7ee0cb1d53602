"""The config sections pretraining (base.py) and fine-tuning (finetune_base.py) declare alike: the
model's numerics, the optimizer's fixed settings and the device mesh. Each base passes what its
recipe sets itself (the preset, the learning rate and its schedule, Adam's epsilon, bias
correction). Not a config itself (the leading underscore keeps it out of the shipped list).
"""

import ml_collections


def model(preset: str) -> ml_collections.ConfigDict:
    """`preset`: tiny | mini | small | medium | base | large, or from_checkpoint: the shape and
    vocabulary of config.init_checkpoint (a pretraining workdir, a params export or a
    `python -m bertjax.convert --from-hf` output)."""
    section = ml_collections.ConfigDict()
    section.preset = preset
    # 0 keeps the preset's size; set any of these to change one dimension of it.
    section.num_layers = 0
    section.hidden_size = 0
    section.num_heads = 0
    section.intermediate_size = 0
    section.dtype = "float32"               # compute dtype; "bfloat16" on accelerators
    section.param_dtype = "float32"
    section.hidden_dropout = 0.1            # fine-tuning: also the dropout before the classifier
    section.attention_dropout = 0.1
    # "" lets the backend choose jax.nn.dot_product_attention's kernel (used whenever attention
    # dropout is 0, and at inference); "cudnn": cuDNN flash attention on a GPU, with bf16.
    section.attention_implementation = ""
    # "bfloat16" with dtype float32: bf16 matmul operands, fp32 results and everything else
    # (docs/speed.md: 1.16x on a BERT-base pretraining step on a CPU with AVX512-BF16). "" = dtype.
    section.matmul_dtype = ""
    section.scan_layers = True
    section.remat = "none"                  # none | full | save_dots
    section.max_position_embeddings = 512
    section.type_vocab_size = 2             # 0: no segment embeddings (ModernBERT, RoBERTa-like)
    section.layer_norm_eps = 1e-12
    # The architecture: BERT's below; configs/modernbert.py sets ModernBERT's (rope, pre, geglu,
    # no biases, sliding windows). With preset from_checkpoint the checkpoint's are used.
    section.position_embedding = "learned"  # learned | rope
    section.rope_theta = 10_000.0           # rope: the global layers' base
    section.rope_local_theta = 10_000.0     # rope: the sliding-window layers' base
    section.norm = "post"                   # post (BERT) | pre (norm before each sublayer)
    section.mlp = "gelu"                    # gelu | geglu (intermediate_size: both halves)
    section.use_bias = True                 # biases in the dense layers
    section.norm_bias = True                # biases in the LayerNorms
    section.global_attention_every = 1      # every n-th layer global, from layer 0
    section.sliding_window = 0              # the other layers' window width (0: all global)
    return section


def optimizer(*, learning_rate: float, eps: float, bias_correction: bool,
              **warmup) -> ml_collections.ConfigDict:
    """AdamW (or LAMB, StableAdamW) with linear decay, weight decay 0.01 and global-norm clipping
    at 1.0. The bases differ in the peak rate, its warmup (`warmup_steps=N` or
    `warmup_fraction=F`), Adam's epsilon and bias correction (the original BERT optimizer had
    none)."""
    section = ml_collections.ConfigDict()
    # stable_adamw: AdamW with per-tensor update clipping (ModernBERT's StableAdamW), which
    # replaces gradient clipping there (clip_norm 0); it always bias-corrects, as lamb does.
    section.name = "adamw"                  # adamw | lamb | stable_adamw
    section.learning_rate = learning_rate
    section.update(warmup)
    # wsd, wsd_sqrt: warmup, the peak, then a linear or 1-sqrt (ModernBERT's) cooldown over the
    # last decay_fraction of the steps; decay_fraction 0 stays at the peak to the end.
    section.decay = "linear"                # linear | cosine | constant | wsd | wsd_sqrt
    section.decay_fraction = 0.1            # wsd decays only
    section.end_learning_rate = 0.0
    section.b1 = 0.9
    section.b2 = 0.999
    section.eps = eps
    section.weight_decay = 0.01
    # True: decayed weights shrink by (lr_t / learning_rate) * weight_decay a step, not by
    # lr_t * weight_decay (optimi's decouple_lr; ModernBERT's weight_decay 1e-5 assumes it).
    section.fully_decoupled_weight_decay = False
    section.bias_correction = bias_correction
    section.clip_norm = 1.0                 # global norm; 0 disables
    return section


def mesh() -> ml_collections.ConfigDict:
    """Sizes of the (data, fsdp, tensor) axes; one may be -1 (all remaining devices)."""
    section = ml_collections.ConfigDict()
    section.data = -1
    section.fsdp = 1
    section.tensor = 1
    # The devices the axes span: the first N of this machine's (one process only), e.g. to leave
    # the others to another job; -1: every device of every process.
    section.devices = -1
    return section
