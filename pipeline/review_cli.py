"""`detpipe review`: the labels most likely wrong (components/review), a thin adapter."""

from components.review.label_review import CONFIDENT, REVIEW_FLOOR_AP50
from pipeline.cli_types import EXIT_OK, existing_dir, output_dir, review_folds, shards_dir, trained_model_dir
from pipeline.cli_types import positive_int as _positive_int
from pipeline.cli_types import unit_float


def cmd_review(args) -> int:
    from components.review.review import review_model

    if args.review_folds:
        from components.review.fold_review import fold_cost

        print(f"reviewing the train split too: {fold_cost(args.model, args.review_folds, args.fold_epochs)}",
              flush=True)
    result = review_model(args.model, args.data, args.output, confident=args.confident,
                          evaluation_dir=args.evaluation, folds=args.review_folds, fold_epochs=args.fold_epochs,
                          floor=args.floor)
    print(f"{result.images - result.train_images} val"
          + (f" and {result.train_images} train" if result.train_images else "")
          + f" images reviewed: {result.summary} -> {args.output}/label_review.html, "
          f"{args.output}/label_review.jsonl")
    return EXIT_OK


def add_review_command(sub) -> None:
    """Add `review` to the `detpipe` parser."""
    p = sub.add_parser("review", help="the val labels most likely wrong (missing, wrong-class, misplaced, duplicate "
                                      "boxes), from a trained model's predictions",
                       description="Score the val split's labels against the predictions of a model trained "
                                   "without them (cleanlab's object-detection scores: missing, wrong-class and "
                                   "misplaced boxes; and duplicate boxes) and write label_review.jsonl (the flagged "
                                   "issues, best first, boxes in the images' pixels, for a labelling tool) and "
                                   "label_review.html (crops to look at). The pipeline's review step runs this "
                                   "after every evaluation.")
    p.add_argument("--model", required=True, type=trained_model_dir, help="output folder of `detpipe train`")
    p.add_argument("--data", required=True, type=shards_dir, help="output folder of `detpipe data build` (its val "
                                                                    "split is reviewed; with --review-folds, its "
                                                                    "train split too)")
    p.add_argument("--output", required=True, type=output_dir, help="folder for label_review.jsonl and "
                                                                      "label_review.html")
    p.add_argument("--confident", type=unit_float, default=None,
                   help="score from which a prediction counts as evidence against a label (default: the "
                        "evaluation's best-F1 threshold from --evaluation, else "
                        f"{CONFIDENT})")
    p.add_argument("--evaluation", type=existing_dir, default=None,
                   help="output folder of `detpipe evaluate` for this model on this data: its detections are "
                        "reviewed (no second prediction pass) and its threshold is the default --confident")
    p.add_argument("--floor", type=unit_float, default=REVIEW_FLOOR_AP50, metavar="AP50",
                   help="the model's val AP50 under which it is too weak to judge the labels: nothing it finds is "
                        "flagged then (duplicates still are), and the summary says why; 0: judge with any model "
                        "(default %(default)s)")
    p.add_argument("--review-folds", type=review_folds, default=0, metavar="K",
                   help="also review the train split: K models trained from scratch with the model's options on "
                        "K-1 folds each predict the fold they did not see. Costs about K-1 times the model's "
                        "training (printed first); default 0: val only")
    p.add_argument("--fold-epochs", type=_positive_int, default=None,
                   help="epochs of each fold model (default: the model's)")
    p.set_defaults(func=cmd_review)
