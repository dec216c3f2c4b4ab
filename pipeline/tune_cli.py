"""`detpipe tune | tune-trial`: the hyperparameter search (components/tune), a thin adapter."""

import sys

from components.tune.hparams_file import SEARCH_SPACE
from components.tune.trials import TRIAL_OWN
from pipeline.cli_types import EXIT_OK, existing_file, output_dir, shards_dir
from pipeline.params import BY_NAME, add_declared_option, add_training_options, declared, training_values
from pipeline.train_cli import HPARAMS_OPTIONS


def cmd_tune(args) -> int:
    from components.train.loop import PREEMPTED_EXIT_CODE, Preempted
    from components.tune.hparams_file import BEST_FILE
    from components.tune.search import TuneConfig, tune
    from components.tune.study import SearchStopped

    try:
        result = tune(TuneConfig(data_dir=args.data, output_dir=args.output, trials=args.tune_trials,
                                 trial_epochs=args.tune_trial_epochs, backend="local",  # no trial machine here
                                 parallel=args.tune_parallel_trials, seed=args.seed, train=training_values(args),
                                 start={name: getattr(args, name) for name in HPARAMS_OPTIONS}))
    except (Preempted, SearchStopped) as stopped:  # as `train`: the code a restarting scheduler expects
        print(f"detpipe: {stopped}", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    best = result.best
    chosen = ", ".join(f"{k}={v:.4g}" for k, v in best.hparams.items())
    print(f"tune: {best.decision}")
    if best.trials:
        gain = "n/a" if best.gain is None else f"{best.gain:+.4f}"
        print(f"{best.trials} trials in {best.search['seconds']:.0f} s ({best.search['cost']:g}x the training's steps); "
              f"{best.metric} {result.best_score:.4f}, {gain} over the defaults")
    print(f"{chosen} -> {args.output}/{BEST_FILE} (use: detpipe train --hparams {args.output}/{BEST_FILE})")
    return EXIT_OK


def cmd_tune_trial(args) -> int:
    from components.tune.vertex_job import vertex_trial

    hparams = {name: getattr(args, name) for name in SEARCH_SPACE if getattr(args, name) is not None}
    score = vertex_trial(args.plan, args.output, hparams)
    print(f"tune-trial: mAP@[.5:.95] on the tuning split {score:.4f}")
    return EXIT_OK


def add_tune_commands(sub) -> None:
    """Add `tune`, and `tune-trial` that a Vertex AI tuning job runs, to the `detpipe` parser."""
    p = sub.add_parser(
        "tune", help="search learning rate, weight decay and augmentation strength on images held out of train",
        description="Trials are short versions of the training tuned (its batch, input size, precision and schedule "
                    "shape, fewer epochs) on part of the train split, scored by mAP on the rest of it (held out by "
                    "the data split's hash rule); the val split is never read. Optuna's TPE sampler proposes the "
                    "values, a successive-halving pruner stops poor trials early; the given values are the first "
                    "trial. A SIGTERM checkpoints the running trial and exits 143: the same command goes on from "
                    "there. Writes OUTPUT/best_hparams.json for `detpipe train --hparams`.")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir,
                   help="folder for best_hparams.json, trials.jsonl, tune_report.md, the study and the trials")
    for name in ("tune_trials", "tune_trial_epochs", "tune_parallel_trials"):
        add_declared_option(p, name, BY_NAME[name].option.replace("--tune-", "--"))
    add_training_options(p, leave_out=tuple(TRIAL_OWN))  # base_lr_per_64, ... : the first candidate
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser(
        "tune-trial", help="one trial of a Vertex AI tuning job (the tune step starts them; not for hand use)",
        description="Train the regime of a search plan (the tune step's search_plan.json) with the values Vertex AI "
                    "passes as --NAME=VALUE, score each rung on the tuning split and report it to the service "
                    "(cloudml-hypertune). Resumes from its checkpoints when Vertex restarts it.")
    p.add_argument("--plan", required=True, type=existing_file, help="the tune step's search_plan.json")
    p.add_argument("--output", required=True, help="folder for the trials' models (a folder per trial id)")
    for name in SEARCH_SPACE:  # Vertex's spelling: --base_lr_per_64=0.01
        given = declared(name, help=BY_NAME[name].help.replace("%", "%%") + f" (default {BY_NAME[name].default})")
        p.add_argument(f"--{name}", **{**given, "default": None})
    p.set_defaults(func=cmd_tune_trial)
