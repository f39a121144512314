"""The rule that ships a quantized precision for a model, in code and, from the same constants, in words.

A quantized precision (fp8, int8) ships only if both hold:
- speed: at every batch size users run, it is faster than fp16 by more than the timing margin
  (fp16 ms / variant ms > 1 + margin; both rows timed stably: an unstable row proves nothing);
- quality: at every batch size measured, at least `MIN_AGREEMENT` of the held-out images keep timm
  fp32's top-1 class.
Otherwise the decision lists every reason it fails. The report adds that agreement on random weights
is a proxy, and lists non-finite outputs on stress inputs beside the decision (the rule does not weigh
them: fp16 itself can overflow on noise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

MIN_AGREEMENT = 0.99


@dataclass(frozen=True)
class Decision:
    precision: str
    ships: bool
    reasons: tuple[str, ...]  # why it does not ship; empty when it does
    speedups: Mapping[int, float | None]  # fp16 ms / variant ms at each batch size users run
    agreement: float | None  # the lowest over the batch sizes measured

    def evidence(self) -> str:
        """The speed-ups and the agreement the decision read."""
        ratios = ", ".join(f"batch {b}: " + ("—" if r is None else f"{r:.2f}x") for b, r in self.speedups.items())
        agreement = "—" if self.agreement is None else f"{self.agreement:.1%}"
        return f"{ratios} the speed of fp16; {agreement} top-1 agreement with timm fp32"

    def summary(self) -> str:
        """One line: the decision and why."""
        if self.ships:
            return f"{self.precision} ships: {self.evidence()}"
        return f"{self.precision} is not shipped: " + "; ".join(self.reasons)

    def to_json(self) -> dict:
        return {
            "precision": self.precision,
            "ships": self.ships,
            "reasons": list(self.reasons),
            "speedup_vs_fp16": {str(b): None if r is None else round(r, 4) for b, r in self.speedups.items()},
            "agreement": self.agreement,
            "summary": self.summary(),
        }


def decide(
    precision: str,
    fp16_ms: Mapping[int, float | None],
    variant_ms: Mapping[int, float | None],
    agreements: Mapping[int, float | None],
    user_batches: tuple[int, ...],
    margin: float,
) -> Decision:
    """The rule (see the module docstring). `*_ms` map batch sizes to stable median times (None: no
    stable result); `agreements` map the batch sizes measured to top-1 agreement (None: not measured)."""
    reasons: list[str] = []
    speedups: dict[int, float | None] = {}
    for batch in user_batches:
        ours, fp16 = variant_ms.get(batch), fp16_ms.get(batch)
        if ours is None or fp16 is None:
            speedups[batch] = None
            missing = " and ".join(n for n, ms in ((precision, ours), ("fp16", fp16)) if ms is None)
            reasons.append(f"batch {batch}: no stable time for {missing}, so no speed-up is shown")
            continue
        speedups[batch] = fp16 / ours
        if speedups[batch] <= 1 + margin:
            reasons.append(
                f"batch {batch}: {speedups[batch]:.2f}x the speed of fp16, not faster by more than the {margin:.0%} margin"
            )
    measured = [a for a in agreements.values() if a is not None]
    agreement = min(measured) if measured and len(measured) == len(agreements) else None
    if agreement is None:
        reasons.append("top-1 agreement was not measured at every batch size")
    elif agreement < MIN_AGREEMENT:
        reasons.append(f"{agreement:.1%} top-1 agreement with timm fp32, below {MIN_AGREEMENT:.0%}")
    return Decision(precision, not reasons, tuple(reasons), speedups, agreement)


def rule_text(user_batches: tuple[int, ...], margin: float) -> str:
    """The rule in words, with the numbers it runs with."""
    batches = ", ".join(map(str, user_batches))
    return (
        f"A quantized precision ships only if, at every batch size users run ({batches}), it is faster than fp16 "
        f"by more than the timing margin (fp16 ms / its ms > {1 + margin:g}, both timed stably), and at every batch "
        f"size measured at least {MIN_AGREEMENT:.0%} of the held-out images keep timm fp32's top-1 class. "
        "Otherwise it is not shipped, for the reasons listed."
    )
