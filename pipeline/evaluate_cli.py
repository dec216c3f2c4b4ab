"""`detpipe evaluate`: COCO metrics of a trained model (components/evaluate), a thin adapter."""

from pipeline.cli_types import EXIT_OK, output_dir, shards_dir, trained_model_dir
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.params import declared


def cmd_evaluate(args) -> int:
    from components.evaluate.evaluator import GateFailed, evaluate_detector

    try:
        result = evaluate_detector(args.model, args.data, args.output, min_map=args.min_map)
    except GateFailed as err:
        raise _fail_lines([f"gate failed: {err}"]) from err
    m = result.metrics
    print(f"{result.num_images} val images: mAP@[.5:.95] {m['mAP']:.4f}, AP50 {m['AP50']:.4f}, "
          f"AP75 {m['AP75']:.4f} -> {args.output}/metrics.json")
    return EXIT_OK


def add_evaluate_command(sub) -> None:
    """Add `evaluate` to the `detpipe` parser."""
    p = sub.add_parser("evaluate", help="COCO metrics of a trained model on the val split")
    p.add_argument("--model", required=True, type=trained_model_dir, help="output folder of `detpipe train`")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build`")
    p.add_argument("--output", required=True, type=output_dir, help="folder for metrics.json and eval_report.md")
    p.add_argument("--min-map", **declared("min_map", help="exit 1 when mAP@[.5:.95] is below this (default "
                                                          "%(default)s)"))
    p.set_defaults(func=cmd_evaluate)
