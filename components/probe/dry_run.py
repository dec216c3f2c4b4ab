"""A dry run of the real training on the training machine, for the probe.

It runs the train step's own code (`train_detector`: the fitted shape, the plan, the
strategy over this machine's devices, the precision policy and the XLA choice that training
will use, checkpoints, the swap to the weight average, `model.keras`) for DRY_RUN_STEPS
steps on the real shards, then exports the model as the export step does (load, trace,
SavedModel). Whatever would stop the real run in any of those places stops here first,
after a minute instead of after hours: a policy the optimizer cannot take, an op XLA
cannot compile, a strategy that cannot split the batch, a model that cannot be saved or
traced.

What it does not prove: speed and memory at the real batch. It trains DRY_RUN_IMAGES images
per device a step (the batch search measures memory with trial steps, training reports its
speed), and it starts from scratch even when training will start warm.

Example (the fix for an error is looked up by its kind):
    >>> fix_for(RuntimeError("Detected unsupported operations when trying to compile graph on XLA_GPU_JIT"))
    'train with --xla off (and report the op that XLA could not compile)'
"""

from __future__ import annotations

import logging
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace

from components.train.config import ProbeAdvice, TrainConfig

logger = logging.getLogger(__name__)

DRY_RUN_STEPS = 2
DRY_RUN_IMAGES = 2  # per device and step: the dry run checks the code paths, not the memory
# The shortest deadline a budgeted dry run gets, far enough that its steps all run; a longer budget
# (or `auto`) is kept, so the dry run plans what the run will, the input size a budget affords included.
DRY_RUN_BUDGET = "10m"
# Train images a budgeted dry run holds out and scores once (the curve's code path, not its
# precision): scoring the demo's 407 held-out images took 4.7 s of a 35 s probe on 2 cores.
DRY_RUN_HELD_OUT = 16


@dataclass(frozen=True)
class DryRun:
    passed: bool
    seconds: float
    what: str  # what ran: precision, XLA, devices, input size, steps
    error: str = ""  # the first error, one line
    fix: str = ""
    decisions: dict | None = None  # the plan's decisions, as the real run would print them

    def to_dict(self) -> dict:
        return asdict(self)


# (text in the error, the fix), first match wins.
_FIXES = (
    ("XLA", "train with --xla off (and report the op that XLA could not compile)"),
    ("ResourceExhausted", "a smaller --image-size or --model-size, or a GPU with more memory: not even the dry run's "
                          f"{DRY_RUN_IMAGES} images a device fit"),
    ("out of memory", "a smaller --image-size or --model-size, or a GPU with more memory"),
    ("LossScaleOptimizer", "train with --precision float32 or mixed_bfloat16 (and report the error)"),
    ("float16", "train with --precision float32 (and report the error)"),
    ("bfloat16", "train with --precision float32 (and report the error)"),
    ("anchor", "a larger --image-size, or --allow-poor-anchors (see the train report's shape decisions)"),
    ("non-finite", "check the data (rejects, box coordinates) or lower --base-lr"),
)


def fix_for(error: BaseException) -> str:
    """The fix to print beside `error` (its type name and message are searched)."""
    text = f"{type(error).__name__}: {error}"
    for needle, fix in _FIXES:
        if needle.lower() in text.lower():
            return fix
    return "the error above stops training on this machine too; run `detpipe train` here to see it whole"


def dry_run(config: TrainConfig, recommendations: dict | None = None, steps: int = DRY_RUN_STEPS) -> DryRun:
    """Run `steps` steps of the real training of `config` (its data, shape, precision, XLA) on
    this machine's devices, save, swap in the weight average, and export; PASS or the first
    error with its fix. `recommendations` (the probe's) are the advice training will get.
    Nothing is written outside a temporary folder."""
    from components.export.saved_model import export_trained
    from components.train.distribution import training_devices
    from components.train.trainer import train_detector

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="detpipe-dry-run-") as scratch:
        # A budgeted config keeps its curve (carve, held-out scores); its deadline is at least DRY_RUN_BUDGET.
        trial = replace(config, output_dir=scratch, max_steps=steps, checkpoint_every=1,
                        time_budget=dry_run_budget(config.time_budget),
                        holdout=_held_out_share(config),
                        cache="",  # a file cache would be written outside the scratch folder, and half
                        batch_size=DRY_RUN_IMAGES * max(1, len(training_devices())),
                        init_from=None, init_name="", init_note="the dry run starts from scratch",
                        probe=ProbeAdvice.from_recommendations(recommendations) if recommendations else config.probe)
        try:
            result = train_detector(trial)
            export_trained(scratch, f"{scratch}/saved_model")
        except Exception as err:  # any failure is the answer: report it, do not raise
            logger.warning("dry run failed:\n%s", traceback.format_exc())
            first = str(err).strip().splitlines()[0][:400] if str(err).strip() else ""
            return DryRun(False, round(time.monotonic() - started, 1), _what(config, steps),
                          f"{type(err).__name__}: {first}", fix_for(err))
    decisions = result.decisions
    what = (f"{result.steps} steps of {result.batch_size} images at {result.shape.get('image_size')} px; precision "
            f"{decisions['precision']}; XLA {decisions['xla']}; {decisions['devices']}; then a checkpoint, the weight "
            "average, model.keras and the SavedModel export")
    return DryRun(True, round(time.monotonic() - started, 1), what, decisions=decisions)


def dry_run_budget(budget: str) -> str:
    """The dry run's time budget: the run's own, or DRY_RUN_BUDGET where that is shorter.

    >>> dry_run_budget("auto"), dry_run_budget("25m"), dry_run_budget("15s")
    ('auto', '25m', '10m')
    """
    from components.train.time_budget import AUTO, budget_seconds

    if budget == AUTO or budget_seconds(budget) >= budget_seconds(DRY_RUN_BUDGET):
        return budget
    return DRY_RUN_BUDGET


def _held_out_share(config: TrainConfig) -> float:
    """The share of train a dry run holds out: about DRY_RUN_HELD_OUT images (the training's
    share where that is fewer)."""
    from components.detector.records import count_records

    return min(config.holdout, DRY_RUN_HELD_OUT / max(1, count_records(config.data_dir, "train")))


def _what(config: TrainConfig, steps: int) -> str:
    return f"{steps} steps, --precision {config.precision}, --xla {config.xla}, --image-size {config.image_size}"
