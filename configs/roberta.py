"""RoBERTa's recipe (Liu et al., 2019) on a BERT-base encoder: MLM only, no NSP, full sentences
packed across documents at 512 tokens from the start, dynamic masks, large batches, Adam with
bias correction and beta2 = 0.98."""

from configs import base


def get_config():
    config = base.get_config()
    config.objective = "roberta"
    config.schedule.long_fraction = 1.0
    config.train.steps = 500_000
    config.train.batch_size = 8192
    config.optimizer.learning_rate = 6e-4
    config.optimizer.warmup_steps = 24_000
    config.optimizer.b2 = 0.98
    config.optimizer.bias_correction = True
    return config
