"""The length schedule: which sequence length (and prediction budget) each training step uses,
e.g. BERT's 90% of steps at 128 tokens, then 512."""

from __future__ import annotations

import bisect
import dataclasses

from bertjax.data.examples import MIN_SEQ_LEN
from bertjax.core.errors import UserError, check_int


@dataclasses.dataclass(frozen=True)
class Phase:
    seq_len: int
    max_predictions: int
    start_step: int
    # The global layers' rotary base in this phase; 0: the model's. ModernBERT trains at 1,024
    # tokens with 10,000, then extends its context to 8,192 with the model's 160,000.
    rope_theta: float = 0.0

    def __post_init__(self):
        check_int("seq_len", self.seq_len, MIN_SEQ_LEN, "([CLS] A [SEP] B [SEP])")
        check_int("max_predictions", self.max_predictions, 1)
        if self.max_predictions > self.seq_len:
            raise UserError(f"max_predictions {self.max_predictions} exceeds seq_len "
                            f"{self.seq_len}")
        check_int("a phase's start_step", self.start_step, 0)
        if self.rope_theta < 0:
            raise UserError(f"a phase's rope theta must be >= 0 (0: the model's), got "
                            f"{self.rope_theta}")
        for name in ("seq_len", "max_predictions", "start_step"):
            object.__setattr__(self, name, int(getattr(self, name)))


@dataclasses.dataclass(frozen=True)
class LengthSchedule:
    phases: tuple[Phase, ...]  # sorted by start_step, the first starting at 0

    def __post_init__(self):
        phases = tuple(self.phases)
        object.__setattr__(self, "phases", phases)
        if not phases or phases[0].start_step != 0:
            raise UserError("a length schedule needs a first phase starting at step 0")
        starts = [p.start_step for p in phases]
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise UserError(f"phase start steps must increase strictly, got {starts}")

    def phase_at(self, step: int) -> Phase:
        if step < 0:
            raise UserError(f"step must not be negative, got {step}")
        return self.phases[bisect.bisect_right([p.start_step for p in self.phases], step) - 1]

    def phase_end(self, phase: Phase, total_steps: int) -> int:
        """The step after `phase`'s last."""
        later = [p.start_step for p in self.phases if p.start_step > phase.start_step]
        return min(later) if later else total_steps

    @classmethod
    def bert(cls, total_steps: int, long_fraction: float = 0.1, short: tuple[int, int] = (128, 20),
             long: tuple[int, int] = (512, 80), short_rope_theta: float = 0.0) -> "LengthSchedule":
        """Short sequences, then long ones for the last `long_fraction` of the steps; the short
        phase's rotary base is `short_rope_theta` (0: the model's)."""
        check_int("total_steps", total_steps, 1)
        if not 0.0 <= long_fraction <= 1.0:
            raise UserError(f"long_fraction must be in [0, 1], got {long_fraction}")
        long_start = round(total_steps * (1.0 - long_fraction))
        if long_fraction == 0 or long_start >= total_steps:
            return cls((Phase(*short, 0, short_rope_theta),))
        if long_start <= 0:
            return cls((Phase(*long, 0),))
        return cls((Phase(*short, 0, short_rope_theta), Phase(*long, long_start)))
