"""What the core needs from the operator's configuration, validated where it is built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

__all__ = ["CoreSettings", "TARGET_MODES"]

TARGET_MODES = ("base", "auto")


@dataclass(frozen=True)
class CoreSettings:
    """What the core needs from the operator's configuration (validated here too)."""

    base_chunk: int
    smooth_factor: float = 1.0
    min_chunk: int = 4096
    block_size: int = 16
    num_samples: int = 64
    online_calibration: bool = True
    calibration_window: int = 256
    max_failed_fits: int = 8
    # After calibration gave up, one step in this many is timed (a device sync each).
    fallback_timing_period: int = 16
    pp_size: int = 2
    reference_prompt_len: int | None = None
    # "base": every step aims at the base chunk's cost; "auto": core/auto_target.py picks it.
    target_mode: str = "base"
    # The engine's step token budget (max_num_batched_tokens); None: the base chunk.
    step_budget: int | None = None

    def __post_init__(self) -> None:
        positive = ("base_chunk", "block_size", "num_samples", "calibration_window",
                    "max_failed_fits", "fallback_timing_period", "pp_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.min_chunk, bool) or not isinstance(self.min_chunk, int) \
                or self.min_chunk < 0:
            raise ValueError(f"min_chunk must be a non-negative integer, got {self.min_chunk!r}")
        if not 0.0 < float(self.smooth_factor) <= 1.0:
            raise ValueError(f"smooth_factor must be in (0, 1], got {self.smooth_factor!r}")
        if self.target_mode not in TARGET_MODES:
            raise ValueError(f"target_mode must be one of {', '.join(TARGET_MODES)}, "
                             f"got {self.target_mode!r}")
        budget = self.step_budget
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)
                                   or budget < self.base_chunk):
            raise ValueError(f"step_budget must be an integer >= base_chunk "
                             f"({self.base_chunk}), got {budget!r}")
        ref = self.reference_prompt_len
        if ref is not None and (isinstance(ref, bool) or not isinstance(ref, int) or ref < 1):
            raise ValueError(f"reference_prompt_len must be a positive integer, got {ref!r}")

    @property
    def sweep_top(self) -> int:
        """The largest chunk of the startup sweep: the base chunk, or under ``auto`` the step
        budget, whose whole range auto plans in (its base chunk may sit below it)."""
        if self.target_mode == "auto" and self.step_budget is not None:
            return self.step_budget
        return self.base_chunk

    @property
    def reference_len(self) -> int:
        return self.reference_prompt_len or 8 * self.base_chunk

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> CoreSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
