"""SpanBERT (Joshi et al., 2020): contiguous spans masked (length ~ Geometric(0.2), at most 10
words), predicted by MLM and by the span boundary objective; single segments of 512 tokens, no
NSP."""

from configs import base


def get_config():
    config = base.get_config()
    config.objective = "spanbert"
    config.masking.strategy = "span"
    config.schedule.long_fraction = 1.0
    config.train.steps = 2_400_000
    config.optimizer.bias_correction = True
    return config
