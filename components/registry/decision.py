"""The promotion rule: when does a challenger replace the champion?

- `promote_if="not_worse"` (default): the challenger wins unless the 95% interval of
  ΔmAP (challenger − champion, same val images) lies entirely below `-max_regression`.
  A challenger statistically indistinguishable from the champion wins: it has seen newer
  data, and a schedule that never promotes on a tie keeps an ever older model.
- `promote_if="better"`: the interval must lie entirely above 0.
- Either way a challenger below `min_map` (mAP@[.5:.95] on its own val split) loses, and
  with no champion the challenger is blessed.

Example:
    >>> rule = PromotionRule()
    >>> decide(rule, 0.30, None).blessed
    True
    >>> decide(rule, 0.30, DeltaInterval(-0.2, -0.25, -0.15)).reason
    'ΔmAP -0.200 (95% CI -0.250 .. -0.150) lies entirely below -0.010: worse than the champion'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

RULES = ("not_worse", "better")


@dataclass(frozen=True)
class PromotionRule:
    promote_if: str = "not_worse"
    max_regression: float = 0.01
    min_map: float = 0.0

    def __post_init__(self):
        if self.promote_if not in RULES:
            raise ValueError(f"promote_if must be one of {', '.join(RULES)}, got {self.promote_if!r}")
        if self.max_regression < 0:
            raise ValueError(f"max_regression must be >= 0, got {self.max_regression}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DeltaInterval:
    delta: float
    low: float
    high: float

    def text(self) -> str:
        return f"{self.delta:+.3f} (95% CI {self.low:+.3f} .. {self.high:+.3f})"

    def to_dict(self) -> dict:
        return {"delta": round(self.delta, 6), "low": round(self.low, 6), "high": round(self.high, 6)}


@dataclass(frozen=True)
class Verdict:
    blessed: bool
    reason: str
    below_min_map: bool = False

    @property
    def word(self) -> str:
        return "blessed" if self.blessed else "rejected"


def decide(rule: PromotionRule, challenger_map: float, delta: DeltaInterval | None) -> Verdict:
    if challenger_map < rule.min_map:
        return Verdict(False, f"mAP {challenger_map:.3f} is below min_map {rule.min_map:.3f}", below_min_map=True)
    if delta is None:
        return Verdict(True, "no champion yet: the first version is blessed")
    if rule.promote_if == "better":
        if delta.low > 0:
            return Verdict(True, f"ΔmAP {delta.text()} lies above 0: better than the champion")
        return Verdict(False, f"ΔmAP {delta.text()} does not lie entirely above 0: not shown to be better")
    if delta.high < -rule.max_regression:
        return Verdict(False, f"ΔmAP {delta.text()} lies entirely below {-rule.max_regression:+.3f}: "
                              "worse than the champion")
    return Verdict(True, f"ΔmAP {delta.text()} is not below {-rule.max_regression:+.3f}: not worse than the champion")


def comparison_line(decision: dict) -> str:
    """One line for people: the summary of a run ends with it."""
    rule = decision["rule"]["promote_if"]
    champion = decision.get("champion")
    if not champion or "mAP_shared" not in champion:
        return f"{decision['verdict']} ({rule}): {decision['reason']}"
    delta = decision["delta"]["mAP"]
    shared = decision["classes"]["shared"]
    scope = "" if not (decision["classes"]["challenger_only"] or decision["classes"]["champion_only"]) else \
        f" ({len(shared)} shared class{'es' if len(shared) != 1 else ''})"
    return (f"champion {champion['version']} mAP {champion['mAP_shared']:.3f} vs challenger "
            f"{decision['challenger']['mAP_shared']:.3f} on the same {decision['val']['images']} val images{scope}: "
            f"Δ {delta['delta']:+.3f} (95% CI {delta['low']:+.3f} .. {delta['high']:+.3f}): "
            f"{decision['verdict']} ({rule})")
