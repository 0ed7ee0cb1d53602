"""What masked-LM masking does, validated: the strategy, the rates of the 80/10/10 choice, where
random replacements come from, and SpanBERT's span-length law."""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.core.errors import UserError, check_choice

STRATEGIES = ("token", "whole_word", "span")
RANDOM_TOKEN_SOURCES = ("uniform", "unigram")


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """The masking section: which tokens are predicted and what replaces them (BERT's 15% and
    80/10/10 by default)."""

    strategy: str = "token"            # "token" | "whole_word" | "span"
    mask_prob: float = 0.15            # fraction of non-special tokens selected for prediction
    mask_token_prob: float = 0.8       # of the selected: replaced by [MASK]
    random_token_prob: float = 0.1     # of the selected: a random token instead (rest unchanged)
    random_token_source: str = "uniform"   # "uniform" over non-special vocab, or "unigram"
    span_geometric_p: float = 0.2      # SpanBERT span length in words ~ Geometric(p), renormalized
    max_span_length: int = 10          # ... over 1..max_span_length

    def __post_init__(self):
        check_choice("masking.strategy", self.strategy, STRATEGIES)
        check_choice("masking.random_token_source", self.random_token_source,
                     RANDOM_TOKEN_SOURCES)
        for name, zero_allowed in (("mask_prob", False), ("mask_token_prob", True),
                                   ("random_token_prob", True), ("span_geometric_p", False)):
            value = getattr(self, name)
            number = isinstance(value, (int, float, np.integer, np.floating)) \
                and not isinstance(value, bool)
            if not number or not (0.0 < value <= 1.0 or (zero_allowed and value == 0.0)):
                interval = "[0, 1]" if zero_allowed else "(0, 1]"
                raise UserError(f"masking.{name} must be a number in {interval}, got {value!r}")
        if self.mask_token_prob + self.random_token_prob > 1.0 + 1e-9:
            raise UserError(f"masking.mask_token_prob + masking.random_token_prob must not exceed "
                            f"1, got {self.mask_token_prob} + {self.random_token_prob}")
        if not is_int(self.max_span_length) or self.max_span_length < 1:
            raise UserError(f"masking.max_span_length must be a positive integer, "
                            f"got {self.max_span_length!r}")

    def span_length_pmf(self) -> np.ndarray:
        """P(span = k words) for k = 1..max_span_length: SpanBERT's renormalized geometric law."""
        k = np.arange(1, self.max_span_length + 1)
        pmf = self.span_geometric_p * (1.0 - self.span_geometric_p) ** (k - 1)
        return pmf / pmf.sum()
