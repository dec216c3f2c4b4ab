"""The promotion rule: when does a challenger replace the champion?

- `promote_if="not_worse"` (default): the challenger wins unless the 95% interval of
  ΔmAP (challenger − champion, same val images) lies entirely below `-max_regression`.
  A challenger statistically indistinguishable from the champion wins: it has seen newer
  data, and a schedule that never promotes on a tie keeps an ever older model.
- `promote_if="better"`: the interval must lie entirely above 0.
- Either way a challenger below `min_map` (mAP@[.5:.95] on its own val split) loses, and so
  does one whose mAP does not beat the box-prior baseline on the same val images (each
  class's most common boxes placed on every image: components/evaluate/baseline.py), a
  first version included: a model that learned nothing is recorded, never promoted. With no
  champion, a challenger above both floors is blessed.

Example:
    >>> rule = PromotionRule()
    >>> decide(rule, 0.30, None).blessed
    True
    >>> decide(rule, 0.30, DeltaInterval(-0.2, -0.25, -0.15)).reason
    'ΔmAP -0.200 (95% CI -0.250 .. -0.150) lies entirely below -0.010: worse than the champion'
    >>> decide(rule, 0.00009, None, baseline_map=0.0123).reason
    "mAP 0.000090 does not beat the box-prior baseline's 0.012300: the model learned nothing usable"
    >>> DeltaInterval(-0.0000016, -0.0000031, -0.0000004).text()
    '-0.0000016 (95% CI -0.0000031 .. -0.0000004)'
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

# The confidence of the bootstrap interval of the mAP difference the promotion rules read
# (components/evaluate/bootstrap.py computes it).
CONFIDENCE_LEVEL = 0.95

RULES = ("not_worse", "better")
DECISION_FILE = "decision.json"


def readable(*values: float) -> list[str]:
    """The values with one number of decimals: 3, or, when a non-zero value would print as
    0.000, enough for the smallest to show two significant digits (at most 7): 0.000088 is
    not printed as 0.000.

    >>> readable(0.0123, -0.004), readable(0.000088, 0.0123), readable(0.0, 0.5)
    (['0.012', '-0.004'], ['0.000088', '0.012300'], ['0.000', '0.500'])
    """
    smallest = min((abs(v) for v in values if v), default=1.0)
    decimals = 3 if smallest >= 0.0005 else min(7, 1 - math.floor(math.log10(smallest)))
    return [f"{v:.{decimals}f}" for v in values]


@dataclass(frozen=True)
class PromotionRule:
    """The rule a challenger is promoted by, declared once: the pipeline's promote_if,
    max_regression and min_map parameters (their help and choices in each field's metadata)
    and the evaluate step's inputs are made from these fields."""

    promote_if: str = field(default="not_worse", metadata={"choices": RULES, "help": (
        f"Promotion rule: not_worse (blessed unless the {CONFIDENCE_LEVEL:.0%} interval of the mAP difference lies "
        "entirely below -max_regression) or better (the interval must lie above 0).")})
    max_regression: float = field(default=0.01, metadata={"help": (
        "How far below the champion's mAP the whole interval of the difference must lie for a challenger to lose "
        "under not_worse.")})
    min_map: float = field(default=0.0, metadata={"help": (
        "A challenger below this mAP@[.5:.95] is never promoted, and the run fails (after recording the version).")})

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
        delta, low, high = (v if v.startswith("-") else "+" + v for v in readable(self.delta, self.low, self.high))
        return f"{delta} ({CONFIDENCE_LEVEL:.0%} CI {low} .. {high})"

    def to_dict(self) -> dict:
        return {"delta": round(self.delta, 6), "low": round(self.low, 6), "high": round(self.high, 6)}


@dataclass(frozen=True)
class Verdict:
    blessed: bool
    reason: str
    below_min_map: bool = False  # the min_map gate: the pipeline fails after recording

    @property
    def word(self) -> str:
        return "blessed" if self.blessed else "rejected"

    def as_fields(self) -> dict:
        """The verdict's fields of a DecisionRecord."""
        return {"blessed": self.blessed, "verdict": self.word, "reason": self.reason,
                "below_min_map": self.below_min_map}


def decide(rule: PromotionRule, challenger_map: float, delta: DeltaInterval | None,
           baseline_map: float | None = None) -> Verdict:
    """`baseline_map`: the box-prior baseline's mAP on the same val images (None: no floor)."""
    if challenger_map < rule.min_map:
        mine, floor = readable(challenger_map, rule.min_map)
        return Verdict(False, f"mAP {mine} is below min_map {floor}", below_min_map=True)
    if baseline_map is not None and not challenger_map > baseline_map:
        mine, floor = readable(challenger_map, baseline_map)
        return Verdict(False, f"mAP {mine} does not beat the box-prior baseline's {floor}: "
                              "the model learned nothing usable")
    if delta is None:
        if baseline_map is None:
            return Verdict(True, "no champion yet: the first version is blessed")
        mine, floor = readable(challenger_map, baseline_map)
        return Verdict(True, f"no champion yet, and mAP {mine} beats the box-prior baseline's {floor}: "
                             "the first version is blessed")
    if rule.promote_if == "better":
        if delta.low > 0:
            return Verdict(True, f"ΔmAP {delta.text()} lies above 0: better than the champion")
        return Verdict(False, f"ΔmAP {delta.text()} does not lie entirely above 0: not shown to be better")
    if delta.high < -rule.max_regression:
        return Verdict(False, f"ΔmAP {delta.text()} lies entirely below {-rule.max_regression:+.3f}: "
                              "worse than the champion")
    return Verdict(True, f"ΔmAP {delta.text()} is not below {-rule.max_regression:+.3f}: not worse than the champion")


@dataclass(frozen=True)
class DecisionRecord:
    """`decision.json`: the promotion decision, as evaluation writes it and register, the run
    report, the local run's summary and `detpipe registry show` read it. One definition: a
    missing field fails `from_dict` at once.

    >>> record = DecisionRecord(rule={"promote_if": "not_worse"}, val={"images": 3, "fingerprint": ""},
    ...                         challenger={"mAP": 0.2}, champion=None, **Verdict(True, "first").as_fields())
    >>> DecisionRecord.from_dict(record.to_dict()) == record, comparison_line(record)
    (True, 'blessed (not_worse): first')
    """

    rule: dict  # PromotionRule.to_dict() and the bootstrap's resamples, seed, level
    val: dict  # {"images", "fingerprint"} of the val split both models were scored on
    challenger: dict  # {"mAP"} and, against a champion, {"mAP_shared", "AP50_shared"}
    champion: dict | None  # None, or {"version"} and, when compared, {"mAP_shared", "AP50_shared"}
    blessed: bool
    verdict: str  # "blessed" | "rejected"
    reason: str
    below_min_map: bool
    classes: dict | None = None  # {"shared", "challenger_only", "champion_only"} against a champion
    delta: dict | None = None  # {"mAP", "AP50"}: DeltaInterval.to_dict(); "per_class": {name: ΔAP or None}
    version: str | None = None  # the registry version it was recorded as (set by register)
    # Baseline.to_dict(): the floor on the same val images (None in records written before it)
    baseline: dict | None = None
    # TrainConfigFile.warm_start of the challenger: where its training started (None before warm starts)
    warm_start: dict | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k == "champion"}

    @classmethod
    def from_dict(cls, data: dict) -> "DecisionRecord":
        required = [f.name for f in fields(cls) if f.default is not None or f.name == "champion"]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"{DECISION_FILE} has no {', '.join(missing)}: written by another detpipe?")
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})

    def with_outcome(self, blessed: bool, reason: str, version: str) -> "DecisionRecord":
        """As recorded in the registry: register may overrule the verdict (the champion moved)."""
        return replace(self, blessed=blessed, reason=reason, verdict="blessed" if blessed else "rejected",
                       version=version)

    def interval(self, key: str) -> str:
        """ΔmAP ("mAP") or ΔAP50 ("AP50") against the champion, readable however small."""
        return DeltaInterval(**{k: self.delta[key][k] for k in ("delta", "low", "high")}).text()

    def floor_line(self) -> str | None:
        """The box-prior baseline against this model, for the report and the markdown."""
        if self.baseline is None:
            return None
        mine, floor = readable(self.challenger["mAP"], self.baseline["mAP"])
        return (f"Floor: the box-prior baseline ({self.baseline['description']}) scores mAP {floor} on the same val "
                f"images; this model {mine}.")

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> "DecisionRecord":
        return cls.from_dict(json.loads(Path(path).read_text()))


def comparison_line(decision: DecisionRecord) -> str:
    """One line for people: the summary of a run ends with it. When a floor (min_map, the
    baseline) decided rather than the champion, the line ends with that reason."""
    rule = decision.rule["promote_if"]
    champion = decision.champion
    if not champion or "mAP_shared" not in champion:
        return f"{decision.verdict} ({rule}): {decision.reason}"
    shared = decision.classes["shared"]
    scope = "" if not (decision.classes["challenger_only"] or decision.classes["champion_only"]) else \
        f" ({len(shared)} shared class{'es' if len(shared) != 1 else ''})"
    theirs, mine = readable(champion["mAP_shared"], decision.challenger["mAP_shared"])
    interval = decision.interval("mAP")
    floor = f": {decision.reason}" if decision.below_min_map or below_baseline(decision) else ""
    return (f"champion {champion['version']} mAP {theirs} vs challenger {mine} on the same "
            f"{decision.val['images']} val images{scope}: Δ {interval}: {decision.verdict} ({rule}){floor}")


def below_baseline(decision: DecisionRecord) -> bool:
    """Whether the challenger failed to beat the box-prior baseline (False when none was recorded)."""
    return decision.baseline is not None and not decision.challenger["mAP"] > decision.baseline["mAP"]
