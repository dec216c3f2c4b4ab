"""The tune step's files: `best_hparams.json`, `trials.jsonl`, `tune_report.md` and its
pictures (the optimisation history and each hyperparameter's importance, drawn by Optuna's
matplotlib plots), which the run report shows."""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import asdict
from pathlib import Path

from components.tune.hparams_file import SEARCH_SPACE
from components.tune.trials import TRIALS_FILE

logger = logging.getLogger(__name__)

REPORT_FILE = "tune_report.md"
HISTORY_PICTURE = "tune_history.png"
IMPORTANCE_PICTURE = "tune_importance.png"


def write_tune_files(result, out: str, study=None) -> None:
    """Write the files of `result` (search.TuneResult) into OUT; pictures when `study` has trials."""
    folder = Path(out)
    result.best.write(out)
    with (folder / TRIALS_FILE).open("w") as handle:
        for trial in result.trials:
            handle.write(json.dumps(asdict(trial)) + "\n")
    pictures = draw_study(study, folder) if study is not None else {}
    (folder / REPORT_FILE).write_text(report_markdown(result, pictures))


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def report_markdown(result, pictures: dict[str, str] | None = None) -> str:
    best = result.best
    lines = ["# Hyperparameter search", "", f"Decision: {best.decision}.", ""]
    if not result.trials:
        lines += ["No search: training uses these values.", "", "| hyperparameter | value |", "|---|---|"]
        lines += [f"| {k} | {v:g} |" for k, v in best.hparams.items()]
        return "\n".join(lines) + "\n"
    search, split = best.search, best.search["tuning_split"]
    gain = "n/a" if best.gain is None else f"{best.gain:+.4f}"
    lines += [
        f"Scored on a tuning split carved from train: {split['held_out']} held-out images "
        f"({split['fraction']:.0%} of train by the data split's hash rule, seed {split['seed']}); trials trained on "
        f"the other {split['fit']}. The val split was never read: the evaluation on val stays the honest figure.", "",
        f"Each trial: {search['regime']}.", "",
        "| | value |", "|---|---|",
        f"| winner | trial {search['best_trial']}{' (the defaults)' if search['best_trial'] == 0 else ''} |",
        f"| winner's {best.metric} | {_fmt(best.score)} |",
        f"| the defaults' {best.metric} | {_fmt(best.defaults_score)} |",
        f"| gain over the defaults | {gain} |",
        f"| cost | {search['steps_trained']} training steps, {search['cost']:g}x the training's {search['training_steps']}; "
        f"{search['seconds']:.0f} s |", "",
        "| hyperparameter | chosen | range |", "|---|---|---|"]
    lines += [f"| {k} | {v:.4g} | {SEARCH_SPACE[k][0]:g} .. {SEARCH_SPACE[k][1]:g}{' (log)' if SEARCH_SPACE[k][2] else ''} |"
              for k, v in best.hparams.items()]
    names = list(SEARCH_SPACE)
    lines += ["", "| trial | state | " + " | ".join(names) + " | mAP at each rung | steps | seconds |",
              "|---" * (len(names) + 5) + "|"]
    for t in result.trials:
        rungs = t.rungs_line(digits=4) or "-"
        state = t.state.lower() + (f": {t.error}" if t.error else "")
        lines.append(f"| {t.number} | {state} | " + " | ".join(f"{t.hparams[n]:.3g}" if n in t.hparams else "-"
                                                              for n in names)
                     + f" | {rungs} | {t.steps} | {t.seconds:.0f} |")
    for title, name in (pictures or {}).items():
        lines += ["", f"## {title}", "", f"![{title}]({name})"]
    return "\n".join(lines) + "\n"


def draw_study(study, folder: Path) -> dict[str, str]:
    """Optuna's optimisation history and parameter importances as PNGs: {title: file name};
    a picture that cannot be drawn (too few finished trials for importances) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as plots

    drawn = {}
    for title, name, draw in (("Optimisation history", HISTORY_PICTURE, plots.plot_optimization_history),
                              ("Hyperparameter importance", IMPORTANCE_PICTURE, plots.plot_param_importances)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                axes = draw(study)
            axes.figure.set_size_inches(7, 4)
            axes.figure.tight_layout()
            axes.figure.savefig(folder / name, dpi=100)
            plt.close(axes.figure)
            drawn[title] = name
        except (ValueError, RuntimeError) as err:  # e.g. importances of fewer than two finished trials
            logger.info("tune: no %s picture: %s", title.lower(), err)
    return drawn
