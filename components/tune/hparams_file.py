"""`best_hparams.json`: what the tune step chose, as the train step, `detpipe train --hparams`,
the run report and the local run's summary read it. One definition for the writer
(components/tune/search.py) and every reader.

>>> best = BestHparams({"base_lr_per_64": 0.01}, score=0.31, defaults_score=0.29, metric="mAP", trials=4,
...                    decision="given", search={})
>>> BestHparams.from_dict(best.to_dict()) == best, round(best.gain, 3)
(True, 0.02)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields

from components.train.config import TrainConfig

BEST_FILE = "best_hparams.json"

# Hyperparameter -> (low, high, log scale): the search space, and the only keys `--hparams` accepts.
# These three are the settings the training recipe was tuned on by hand (docs/training.md); box
# loss, the weight average, input size and model size are fixed by the fitted plan (the issue
# asks for them where they pay on held-out data: not measured yet, so not searched).
SEARCH_SPACE: dict[str, tuple[float, float, bool]] = {
    "base_lr_per_64": (2e-3, 3e-2, True),
    "weight_decay": (1e-5, 1e-3, True),
    "augment_strength": (0.0, 1.0, False),
}
# The first trial, and what `train` uses for a key neither given nor tuned: TrainConfig's own defaults.
DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.name in SEARCH_SPACE}


def _finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None  # strict JSON: null, not NaN


@dataclass(frozen=True)
class BestHparams:
    """The values training takes, their score and the defaults' on the tuning split (None
    without a search), how many trials ran, and why the search ran or not."""

    hparams: dict[str, float]
    score: float | None
    defaults_score: float | None
    metric: str
    trials: int
    decision: str  # one line: how many trials and why (budget.SearchBudget.reason)
    search: dict = field(default_factory=dict)  # the tuning split, trial length, regime, space, cost

    @property
    def gain(self) -> float | None:
        """What the search gained on the tuning split over the defaults (None without a search)."""
        if self.score is None or self.defaults_score is None:
            return None
        return self.score - self.defaults_score

    def to_dict(self) -> dict:
        return {**self.hparams, "score": {"metric": self.metric, "value": _finite_or_none(self.score),
                                          "defaults": _finite_or_none(self.defaults_score)},
                "trials": self.trials, "decision": self.decision, "search": self.search}

    @classmethod
    def from_dict(cls, data: dict) -> "BestHparams":
        score = data.get("score") or {}
        return cls(hparams={k: v for k, v in data.items() if k in SEARCH_SPACE}, score=score.get("value"),
                   defaults_score=score.get("defaults"), metric=score.get("metric", ""),
                   trials=int(data.get("trials", 0)), decision=data.get("decision", ""),
                   search=data.get("search", {}))

    def write(self, folder: str) -> None:
        path, text = f"{folder.rstrip('/')}/{BEST_FILE}", json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"
        if "://" not in path:  # a local folder (the step's own): no TensorFlow to import when no search ran
            with open(path, "w") as handle:
                handle.write(text)
            return
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "w") as handle:
            handle.write(text)


_META = ("score", "trials", "decision", "search")


def search_seconds(path: str) -> float:
    """What the search of a `best_hparams.json` took (0 without a search): the training after it
    has that much less of a shared time budget."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path) as handle:
        return float((json.loads(handle.read()).get("search") or {}).get("seconds", 0.0))


def load_hparams(path: str) -> dict[str, float]:
    """The hyperparameters of a `best_hparams.json`; one line per problem if it is bad."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path) as handle:
        try:
            data = json.loads(handle.read())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of hyperparameters")
    problems, values = [], {}
    for key, value in data.items():
        if key in _META:
            continue
        if key not in SEARCH_SPACE:
            problems.append(f"{path}: unknown hyperparameter {key!r} (known: {', '.join(SEARCH_SPACE)})")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            problems.append(f"{path}: {key} must be a finite number >= 0, got {value!r}")
        elif key == "augment_strength" and value > 1:
            problems.append(f"{path}: augment_strength must be at most 1, got {value}")
        else:
            values[key] = float(value)
    if problems:
        raise ValueError("\n".join(problems))
    return values
