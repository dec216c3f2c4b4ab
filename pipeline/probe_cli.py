"""`detpipe probe`: a thin adapter over components/probe (the machine's checks, the shards',
and the dry run of the real training)."""

from pathlib import Path

from pipeline.cli_types import EXIT_OK, UsageError, existing_file
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.cli_types import output_file, shards_dir
from pipeline.params import add_training_options, training_values


def cmd_probe(args) -> int:
    from components.probe.probe_report import difference_lines, load_baseline, probe_markdown, probe_with_data, write_probe

    baseline = load_baseline(Path(args.baseline)) if args.baseline else None
    if args.dry_run and not args.data:
        raise UsageError("--dry-run trains on the shards: give --data too")
    dry_run = None
    if args.dry_run:
        from components.train.config import TrainConfig

        dry_run = TrainConfig(data_dir=args.data, output_dir="", **training_values(args))
    result = probe_with_data(args.data, training_values(args), dry_run=dry_run, require_gpu=args.require_gpu, baseline=baseline)
    write_probe(result, Path(args.json) if args.json else None, None)
    print(probe_markdown(result))
    if baseline is not None:
        print(f"{len(result.differences)} difference(s) from {args.baseline}:")
        print("\n".join("  " + line for line in difference_lines(result.differences)) or "  none")
    if result.verdict == "FAIL":
        raise _fail_lines([f"{c.name}: {c.reason}; fix: {c.fix}" for c in result.checks if c.status == "FAIL"])
    return EXIT_OK


def add_probe_command(sub) -> None:
    """Add `probe` to the `detpipe` parser."""
    p = sub.add_parser(
        "probe", help="check this machine before training (GPU, driver, CUDA, cuDNN, CPUs, RAM, disk, packages)",
        description="Collect facts about this machine and check them: PASS/WARN/FAIL, each with a fix. "
                    "Exits 1 on FAIL.")
    p.add_argument("--require-gpu", action="store_true", help="FAIL (exit 1) when no GPU is visible")
    p.add_argument("--data", type=shards_dir, help="folder of shards (output of `data build`): measures storage read speed on "
                   "it and checks each shard's sha256 against its manifest.json")
    p.add_argument("--baseline", type=existing_file, help="probe.json written on another machine (e.g. your laptop) to compare with")
    p.add_argument("--json", type=output_file, help="write the full probe result (facts, checks, recommendations) to this file")
    p.add_argument("--dry-run", action="store_true",
                   help="also run a few steps of the real training here on --data (as `train` with the same "
                        "options), checkpoint and export: PASS, or the first error and its fix (as the pipeline's "
                        "probe step does)")
    # The memory check and the input rate assume the model, batch and tiles of these, the dry run all of them.
    add_training_options(p)
    p.set_defaults(func=cmd_probe)
