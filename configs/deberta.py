"""DeBERTa-v3-base's encoder (He et al., 2021/2023) on bertjax's pretraining machinery.

The architecture: BERT-base sizes with disentangled attention instead of absolute positions
(content-to-position and position-to-content scores over relative distances in 256 log
buckets up to 512, one relative embedding table with its LayerNorm shared by every layer and
projected by each layer's own query and key), no segment embeddings, LayerNorm epsilon 1e-7,
a 128,000-token SentencePiece-sized vocabulary. The recipe here is DeBERTa's masked LM (MLM only,
no NSP, full sentences at 512 tokens); DeBERTa-v3's replaced token detection is
`--config.objective=electra` (a generator of base.py's electra section, sharing the word
embeddings by gradient-disentangled embedding sharing: electra.embedding_sharing=auto is gdes for
a DeBERTa discriminator), and its enhanced mask decoder `--config.model.enhanced_mask_decoder=2`
(off here: transformers' masked LM has none, so export gives the encoder alone as DebertaV2Model
then). Export gives Hugging Face's DebertaV2ForMaskedLM (docs/using-a-model.md).

    python -m bertjax.main --config=configs/deberta.py --workdir=DIR \
        --config.data.input='corpus/*.txt'
"""

from configs import base


def set_architecture(config) -> None:
    """DeBERTa-v3's architecture on any preset (shared with small runs and the tests)."""
    model = config.model
    model.position_embedding = "relative"  # 256 buckets up to max_position_embeddings (512)
    model.type_vocab_size = 0
    model.layer_norm_eps = 1e-7


def get_config():
    config = base.get_config()
    set_architecture(config)
    config.objective = "roberta"
    config.schedule.long_fraction = 1.0
    config.data.vocab_size = 128_000
    config.train.steps = 500_000
    config.train.batch_size = 2048
    config.optimizer.learning_rate = 2e-4
    config.optimizer.b2 = 0.98
    config.optimizer.bias_correction = True
    return config
