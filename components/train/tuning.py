"""`detpipe tune`: a budgeted search over learning rate, weight decay and augmentation strength.

Successive halving (one Hyperband bracket): `trials` candidates, the first being the
defaults, train `trial_steps` steps each and are scored by COCO mAP@[.5:.95] on the val
split; the best third trains again, from scratch, for `eta` times as many steps, and the
best of those wins. About 2 x trials x trial_steps training steps in all. Written here
rather than with KerasTuner (not a dependency) because a trial is a whole `train_detector`
run with its own schedule and checkpoints, which KerasTuner's model-building API does not fit.

Writes `best_hparams.json` (read by `detpipe train --hparams`), `trials.jsonl` and `tune_report.md`.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from components.train.config import TrainConfig

logger = logging.getLogger(__name__)

BEST_FILE = "best_hparams.json"
TRIALS_FILE = "trials.jsonl"
REPORT_FILE = "tune_report.md"

# Hyperparameter -> (low, high, log scale). The only keys `--hparams` accepts.
SEARCH_SPACE: dict[str, tuple[float, float, bool]] = {
    "base_lr_per_64": (2e-3, 3e-2, True),
    "weight_decay": (1e-5, 1e-3, True),
    "augment_strength": (0.0, 1.0, False),
}
# The first trial, and what `train` uses for a key neither given nor tuned: TrainConfig's own defaults.
DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.name in SEARCH_SPACE}


@dataclass
class Trial:
    number: int
    hparams: dict[str, float]
    steps: int
    score: float | None = None  # mAP@[.5:.95] on val; None when the trial failed
    error: str | None = None


@dataclass
class TuneResult:
    best: dict[str, float]
    best_score: float
    trials: list[Trial] = field(default_factory=list)


def sample_hparams(rng: random.Random) -> dict[str, float]:
    values = {}
    for name, (low, high, log) in SEARCH_SPACE.items():
        value = math.exp(rng.uniform(math.log(low), math.log(high))) if log else rng.uniform(low, high)
        values[name] = float(f"{value:.3g}")
    return values


def successive_halving(candidates: list[dict[str, float]], run_trial: Callable[[Trial], float],
                       trial_steps: int, eta: int = 3) -> TuneResult:
    """Score every candidate at `trial_steps`; rescore the best 1/eta at `eta * trial_steps`.
    A trial that raises is recorded with its error and ranks last."""
    trials: list[Trial] = []

    def run(hparams: dict[str, float], steps: int) -> Trial:
        trial = Trial(len(trials) + 1, hparams, steps)
        try:
            score = float(run_trial(trial))
            if math.isfinite(score):
                trial.score = score
            else:
                trial.error = f"the score is {score}"
        except Exception as err:  # a diverged or failed trial must not end the search
            trial.error = f"{type(err).__name__}: {err}"
            logger.warning("tune: trial %d failed: %s", trial.number, trial.error)
        trials.append(trial)
        logger.info("tune: trial %d/%d %s at %d steps -> %s", trial.number, len(candidates), hparams, steps,
                    trial.score)
        return trial

    def ranked(rung: list[Trial]) -> list[Trial]:
        return sorted(rung, key=lambda t: -math.inf if t.score is None else t.score, reverse=True)

    first = ranked([run(c, trial_steps) for c in candidates])
    keep = max(1, len(first) // eta)
    final = first[:keep] if keep == len(first) else ranked([run(t.hparams, trial_steps * eta) for t in first[:keep]])
    best = final[0]
    return TuneResult(best=dict(best.hparams), best_score=best.score if best.score is not None else math.nan,
                      trials=trials)


@dataclass(frozen=True)
class TuneConfig:
    data_dir: str
    output_dir: str
    trials: int = 6
    trial_steps: int = 100
    seed: int = TrainConfig.seed
    train: dict = field(default_factory=dict)  # other TrainConfig fields (batch_size, image_size, ...)
    # The first candidate's values of SEARCH_SPACE's keys (the rest: DEFAULTS), and the result
    # without a search (`trials` 0).
    start: dict = field(default_factory=dict)


def tune(config: TuneConfig) -> TuneResult:
    """Run the search with real training and evaluation; write the best hyperparameters."""
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    first = {**DEFAULTS, **config.start}
    candidates = [first] + [sample_hparams(rng) for _ in range(max(0, config.trials - 1))]
    if config.trials < 1:
        result = TuneResult(best=first, best_score=math.nan)
    else:  # imported here: without trials (the default) the step needs no TensorFlow
        from components.evaluate.evaluator import evaluate_detector
        from components.train.trainer import train_detector

        fixed = dict(config.train)

        def run_trial(trial: Trial) -> float:
            folder = out / "trials" / f"{trial.number:03d}"
            train = TrainConfig(data_dir=config.data_dir, output_dir=str(folder / "model"), seed=config.seed,
                                epochs=10**6, max_steps=trial.steps, **fixed)
            chosen = train_detector(replace(train, **trial.hparams))
            fixed["batch_size"] = chosen.batch_size  # `auto` is searched once, by the first trial
            return evaluate_detector(str(folder / "model"), config.data_dir, str(folder / "eval"),
                                     min_map=0.0).metrics["mAP"]

        result = successive_halving(candidates, run_trial, config.trial_steps)
    write_results(result, config, out)
    return result


def write_results(result: TuneResult, config: TuneConfig, out: Path) -> None:
    score = result.best_score if math.isfinite(result.best_score) else None  # strict JSON: null, not NaN
    best = {**result.best, "score": {"metric": "mAP@[.5:.95] on val", "value": score},
            "search": {"trials": config.trials, "trial_steps": config.trial_steps, "seed": config.seed,
                       "space": {k: list(v) for k, v in SEARCH_SPACE.items()}}}
    (out / BEST_FILE).write_text(json.dumps(best, indent=2, allow_nan=False) + "\n")
    with (out / TRIALS_FILE).open("w") as handle:
        for trial in result.trials:
            handle.write(json.dumps(asdict(trial)) + "\n")
    lines = ["# Hyperparameter search", ""]
    if not result.trials:
        lines += ["No trials were run (trials = 0): training uses the defaults.", ""]
    lines += ["| best | value |", "|---|---|"] + [f"| {k} | {v:g} |" for k, v in result.best.items()]
    lines += ["", f"Best mAP@[.5:.95] on val: {result.best_score:.4f}" if score is not None else "", ""]
    if result.trials:
        names = list(SEARCH_SPACE)
        lines += ["| trial | steps | " + " | ".join(names) + " | mAP |", "|---" * (len(names) + 3) + "|"]
        for t in result.trials:
            shown = f"{t.score:.4f}" if t.score is not None else f"failed: {t.error}"
            lines.append(f"| {t.number} | {t.steps} | " + " | ".join(f"{t.hparams[n]:g}" for n in names)
                         + f" | {shown} |")
    (out / REPORT_FILE).write_text("\n".join(lines) + "\n")


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
        if key in ("score", "search"):
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
