"""The refit: after a budgeted run, a second training on the whole train split for the epochs
its held-out curve ran, whose model is then the run's.

A budgeted run trains on the train split less the carve its curve is scored on (holdout.py):
on a small set that is a fifth of its photos. Measured (benchmarks/holdout_carve.py, the table
in docs/measurements.md, test photos no choice saw, 3 seeds): the whole split trained again for
the same epochs scored higher on average on the three sets, raccoon +0.025 in every seed, the
demo and a set of card photos about +0.01. So `auto` refits where the carve is at least
REFIT_MIN_SHARE of train (refit_choice.py) and the refit fits in what the budget has left; the
curve's model stays the run's elsewhere (the refit doubles the train step's time).

The refit is `train_detector` again with `--epochs` given (no carve, no curve: the last
weights, their moving average with --ema) into `REFIT_DIR` of the output; its model.keras then
replaces the curve's, and train_config.json / train_report.md say so. A killed refit resumes
from its own checkpoints: the curve's run is then not trained again.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path

from components.detector.artifacts import CHECKPOINT_DIR, MODEL_FILE, REPORT_FILE, TrainConfigFile
from components.train.config import TrainConfig
from components.train.distribution import cluster_role
from components.train.refit_choice import choose_refit
from components.train.trainer import TrainResult, train_detector

logger = logging.getLogger(__name__)

REFIT_DIR = "refit"  # under the output folder: the refit's checkpoints, TensorBoard logs, model, report
REFIT_SECTION = "\n## Refit\n\n"  # of train_report.md, after the curve's run's report
CURVE_RUN = "curve_run"  # train_config.json's result: the curve's run, beside the refit's figures


def train_and_refit(config: TrainConfig) -> TrainResult:
    """`train_detector(config)`, then for a budgeted run the refit `choose_refit` picks; the
    result describes the model handed over (the refit's when there is one)."""
    out = Path(config.output_dir)
    refit_dir = out / REFIT_DIR
    if config.budgeted and (refit_dir / CHECKPOINT_DIR).exists():  # the refit began: the curve's run is done
        recorded = TrainConfigFile.read(out).result
        first = TrainResult(**recorded.get(CURVE_RUN, recorded))
        logger.info("train: the curve's run is done (train_config.json); resuming the refit in %s", refit_dir)
    else:
        first = train_detector(config)
    if not config.budgeted or not first.is_chief:
        return first
    choice = choose_refit(config.refit, first.num_train, first.held_out, first.epochs, first.seconds,
                          first.budget_seconds, cluster_role().workers)
    logger.info("train: refit = %s", choice.reason)
    if not choice.epochs:
        return _recorded(out, replace(first, decisions={**first.decisions, "refit": choice.reason}), first)
    # At the curve's run's input size where its budget chose it (afforded_size.py); else fitted again, as it was.
    second = train_detector(replace(config, output_dir=str(refit_dir), epochs=choice.epochs,
                                    fine_tune_epochs=choice.epochs, batch_size=first.batch_size,
                                    image_size=first.afforded_size or config.image_size))
    shutil.copyfile(refit_dir / MODEL_FILE, out / MODEL_FILE)
    merged = replace(first, model_path=str(out / MODEL_FILE), weights_sha256=second.weights_sha256,
                     final_loss=second.final_loss, seconds=round(first.seconds + second.seconds, 1), best_step=0,
                     refit=f"{second.epochs:g} epochs ({second.steps} steps) on all {second.num_train} train images",
                     decisions={**first.decisions, "refit": choice.reason})
    logger.info("train: the model is the refit's: %s, final weights sha256 %s", merged.refit, merged.weights_sha256)
    return _recorded(out, merged, first)


def _recorded(out: Path, result: TrainResult, first: TrainResult) -> TrainResult:
    """`result` written into train_config.json (the curve's run kept as CURVE_RUN: what a resumed
    refit starts from) and the refit's lines appended to train_report.md."""
    record = TrainConfigFile.read(out)
    TrainConfigFile(model=record.model, train=record.train, result={**result.to_dict(), CURVE_RUN: first.to_dict()},
                    label_map=record.label_map).write(out)
    lines = [f"- refit: {result.decisions['refit']}"]
    if result.refit:
        lines.append(f"- the model is the refit's: {result.refit} (its report: `{REFIT_DIR}/{REPORT_FILE}`), final "
                     f"weights sha256 `{result.weights_sha256}`; the curve above is the run that chose its epochs")
    report = (out / REPORT_FILE).read_text().split(REFIT_SECTION)[0]  # a resumed refit's section, once
    (out / REPORT_FILE).write_text(report + REFIT_SECTION + "\n".join(lines) + "\n")
    return result
