"""The names of what `detpipe train` writes into its output folder, in one place: readers
(evaluation, export, the run report) import these instead of the whole trainer."""

MODEL_FILE = "model.keras"
CONFIG_FILE = "train_config.json"  # model config, label map, training options and result
HISTORY_FILE = "history.json"
REPORT_FILE = "train_report.md"
LOSS_CURVE_FILE = "loss_curve.png"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINT_DIR = "checkpoints"
