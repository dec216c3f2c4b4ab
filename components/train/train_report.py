"""`train_report.md`: every decision of the run with its reason, the figures, the loss."""

from __future__ import annotations

from pathlib import Path

from beam.contract.data_text import markdown_text
from components.detector.artifacts import LOSS_CURVE_FILE, TENSORBOARD_DIR


def training_report(result, losses: dict[str, list[float]], has_curve: bool) -> str:
    """The Markdown report of a `TrainResult` (trainer.py) and its per-chunk losses."""
    lines = ["# Training report", "", "| decision | value and reason |", "|---|---|"]
    # A decision quotes the data (class names): as text, never markup (beam/contract/data_text.py)
    lines += [f"| {k} | {markdown_text(v)} |" for k, v in result.decisions.items()]
    lines += ["", f"- train images: {result.num_train}", f"- steps: {result.steps}",
              f"- effective batch: {result.batch_size} images per step; micro-batch: {result.micro_batch_size}",
              f"- throughput: {result.images_per_second} images/s; " + (
                  "input wait not measured (--deterministic forbids timestamps in the step)"
                  if result.input_wait_share is None else
                  f"{100 * result.input_wait_share:.1f}% of step time waiting for input"),
              f"- final loss: {'n/a' if result.final_loss is None else f'{result.final_loss:.4f}'}",
              f"- stopped: {result.stopped}",
              *([f"- **{markdown_text(result.short)}**"] if result.short else []),
              f"- final weights sha256: `{result.weights_sha256}`",
              f"- wall time: {result.seconds} s",
              f"- TensorBoard: `tensorboard --logdir {Path(result.model_path).parent / TENSORBOARD_DIR}`", "",
              *([f"![training loss and held-out mAP]({LOSS_CURVE_FILE})", ""] if has_curve else []),
              "| chunk | loss |", "|---|---|"]
    lines += [f"| {i + 1} | {v:.4f} |" for i, v in enumerate(losses.get("loss", []))]
    return "\n".join(lines) + "\n"
