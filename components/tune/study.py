"""The local search's Optuna side: the study in a journal file (so a stopped search goes on
where it stopped), the sampler seeded so that a continued search never proposes a finished
trial's values, the trials scored at each rung for the pruner, in this process or in worker
processes (worker.py), one per GPU."""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time

from components.tune.hparams_file import SEARCH_SPACE
from components.tune.trials import METRIC, REDUCTION, TRIALS_DIR, TrialRecord, TrialRegime, train_rungs

logger = logging.getLogger(__name__)

STUDY_FILE = "study.journal"  # Optuna's journal: every trial's parameters, rung scores and state


class SearchStopped(RuntimeError):
    """A SIGTERM stopped the search; the running trials checkpointed. Run the same command to go on."""


def open_study(out: str, regime: TrialRegime, first: dict[str, float]):
    """The study in OUT's journal, created with the defaults as its first trial, or as left."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own log lines say what each trial did
    storage = JournalStorage(JournalFileBackend(f"{out}/{STUDY_FILE}"))
    study = optuna.create_study(
        study_name="detpipe-tune", storage=storage, direction="maximize", load_if_exists=True,
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=regime.stops[0], reduction_factor=REDUCTION,
                                                      min_early_stopping_rate=0))
    if not study.get_trials(deepcopy=False):
        study.enqueue_trial(first)
    return study


def _ask(study, stream: int):
    """A new trial, sampled with a seed fixed by the seed, the worker's stream and how many
    trials the study holds: the same search proposes the same values whether or not it was
    stopped on the way, and a continued one never the values of a trial it already ran (which
    one sampler seeded once per process would, started again)."""
    import optuna

    begun = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=stream * 10_000 + begun,
                                               multivariate=True, n_startup_trials=4)
    return study.ask()


def _started(study) -> int:
    """Trials begun (running, or finished in any state), the enqueued defaults not yet begun aside."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state.name != "WAITING")


def run_trials(study, regime: TrialRegime, trials: int, out: str, resume: list[int] = (), stream: int = 0) -> None:
    """Continue the trials `resume` names (their ids), then ask for new ones until `trials` began.
    `stream`: the seed's stream this process samples from (`_ask`; a worker of a parallel
    search has its own, else they would propose the same values)."""
    import optuna

    for trial_id in resume:
        run_trial(study, optuna.trial.Trial(study, trial_id), regime, out)
    while _started(study) < trials:
        run_trial(study, _ask(study, stream), regime, out)


def run_trial(study, trial, regime: TrialRegime, out: str) -> None:
    """`score_trial`, then its checkpoints and model removed: the journal holds what it found."""
    score_trial(study, trial, regime, out)
    shutil.rmtree(f"{out}/{TRIALS_DIR}/{trial.number:03d}", ignore_errors=True)


def score_trial(study, trial, regime: TrialRegime, out: str) -> None:
    """Run one Optuna trial (`train_rungs`, continuing it where a stop left it): report each
    rung, prune (never the defaults) or finish; a failure is recorded and the search goes on;
    a SIGTERM (`Preempted`) is not recorded: the trial stays running, for the next run to continue."""
    from optuna.trial import TrialState

    from components.train.trainer import Preempted

    hparams = {name: trial.suggest_float(name, low, high, log=log) for name, (low, high, log) in SEARCH_SPACE.items()}
    stored = study._storage.get_trial(trial._trial_id)  # what a stopped run of this trial recorded
    spent = {"seconds": float(stored.user_attrs.get("seconds", 0.0)), "since": time.monotonic()}
    logger.info("tune: trial %d %s", trial.number, _shown(hparams))

    def on_score(step: int, score: float) -> bool:
        now = time.monotonic()
        spent["seconds"] += now - spent["since"]
        spent["since"] = now
        trial.set_user_attr("seconds", round(spent["seconds"], 1))
        trial.report(score, step)
        logger.info("tune: trial %d at step %d: %s %.4f", trial.number, step, METRIC, score)
        return step != regime.stops[-1] and trial.number > 0 and trial.should_prune()

    try:
        score = train_rungs(regime, f"{out}/{TRIALS_DIR}/{trial.number:03d}/model", hparams,
                            dict(stored.intermediate_values), on_score)
        if not math.isfinite(score):
            raise ValueError(f"the score is {score}")
    except Preempted:
        raise
    except Exception as err:  # a diverged or failed trial must not end the search
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        trial.set_user_attr("error", f"{type(err).__name__}: {first}")
        study.tell(trial, state=TrialState.FAIL)
        logger.warning("tune: trial %d failed: %s", trial.number, err)
        return
    last = max(study._storage.get_trial(trial._trial_id).intermediate_values, default=0)
    if last != regime.stops[-1]:
        study.tell(trial, state=TrialState.PRUNED)
        logger.info("tune: trial %d pruned at step %d", trial.number, last)
    else:
        study.tell(trial, score)


def _shown(hparams: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.3g}" for k, v in hparams.items())


def run_workers(out: str, parallel: int, stale: list[int], gpus: int) -> None:
    """`parallel` worker processes (worker.py) over the one journal, each on its own GPU; the
    stale trials shared out among them. A SIGTERM is passed on to every worker; the search
    stops (SearchStopped) when one of them was stopped."""
    from components.train.trainer import PREEMPTED_EXIT_CODE

    env = dict(os.environ)
    procs = []
    for index in range(parallel):
        if gpus:
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
        mine = ",".join(str(t) for t in stale[index::parallel])
        procs.append(subprocess.Popen([sys.executable, "-m", "components.tune.worker", out, str(index + 1), mine],
                                      env=env))
    logger.info("tune: %d trials at once, one process each", parallel)
    previous = signal.signal(signal.SIGTERM, lambda *_: [p.send_signal(signal.SIGTERM) for p in procs])
    try:
        codes = [p.wait() for p in procs]
    finally:
        signal.signal(signal.SIGTERM, previous)
    if PREEMPTED_EXIT_CODE in codes or -signal.SIGTERM in codes:
        raise SearchStopped("SIGTERM: the running trials checkpointed; run the same command again to continue the "
                            "search")
    if any(codes):
        raise RuntimeError(f"tune: a trial worker exited with {max(codes, key=abs)} (its log is above)")


def trial_records(study) -> list[TrialRecord]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state.name == "WAITING":
            continue
        rungs = {str(step): value for step, value in sorted(t.intermediate_values.items())}
        rows.append(TrialRecord(t.number, t.state.name, dict(t.params),
                                t.value if t.value is not None else (list(rungs.values())[-1] if rungs else None),
                                rungs, max(t.intermediate_values, default=0), float(t.user_attrs.get("seconds", 0.0)),
                                t.user_attrs.get("error")))
    return rows
