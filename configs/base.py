"""BERT-base pretraining as in Devlin et al. (2019): MLM + NSP, 1M steps of 256 sequences,
128 tokens for 90% of the steps and 512 for the rest, AdamW at 1e-4 with 10k warmup steps.

Every other pretraining config imports this one and changes only what differs.

    python -m bertjax.main --config=configs/base.py --workdir=DIR \
        --config.data.input='corpus/*.txt' --config.train.batch_size=256

Each section is built from the dataclass it is read into, which gives every key its default (this
recipe's), its meaning and its check: `section(MaskingConfig)` is bertjax/data/masking_config.py's
MaskingConfig with its defaults.
"""

import ml_collections

from bertjax.data.masking_config import MaskingConfig
from bertjax.settings.defaults import section
from bertjax.settings.electra import ElectraSettings
from bertjax.settings.pretrain import CorpusSettings, PretrainLoop, ScheduleSettings
from bertjax.settings.shared import MeshSettings, ModelSpec
from bertjax.train.optimizer import OptimizerConfig


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.task = "pretrain"
    # Start from another run's parameters: a pretraining workdir or a converted HF checkpoint.
    config.init_checkpoint = ""
    # bert: MLM + NSP; roberta: MLM only, full sentences; spanbert: span masking, MLM + SBO;
    # electra: replaced token detection (configs/electra.py); albert: MLM + sentence-order
    # prediction (configs/albert.py).
    config.objective = "bert"
    # objective=electra only: the generator, the weight of its discriminator's loss and how the
    # two share the word table.
    config.electra = section(ElectraSettings)
    # The model's shape and numerics: a preset (base), sizes, dtypes, dropout, the architecture.
    config.model = section(ModelSpec)
    # The raw text, how it is read and tokenized, and the prepared corpus.
    config.data = section(CorpusSettings, skip=("vocab_size_given",))
    config.masking = section(MaskingConfig)  # BERT's: 15% of the tokens, 80/10/10
    config.schedule = section(ScheduleSettings)  # 128 tokens, then 512 for the last 10%
    config.train = section(PretrainLoop)  # steps, batch, logging, checkpoints, evaluation
    # AdamW with linear decay, weight decay 0.01 and clipping at 1.0; no bias correction, as
    # BERT's optimizer had none. Its total steps are train.steps.
    config.optimizer = section(OptimizerConfig, skip=("total_steps",))
    config.mesh = section(MeshSettings)  # (data, fsdp, tensor) sizes; data -1: the other devices
    return config
