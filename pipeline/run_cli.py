"""`detpipe run --local`: the whole DAG with the KFP local runner, one live line per step."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.cli_types import UsageError
from pipeline.cli_types import fail_lines as _fail_lines
from pipeline.params import add_run_options
from pipeline.preflight import annotations_problem, given_split_problem

EXIT_OK = 0


def cmd_run(args) -> int:
    if not args.local:
        raise UsageError("`detpipe run` needs --local (the KFP local runner); use `detpipe submit` for Vertex AI")
    problem = annotations_problem(args.annotations, args.data_format)
    if problem:  # before kfp loads, the runner starts and the data step imports Beam
        raise UsageError(f"--annotations {problem}")
    problem = given_split_problem(args.data_format, args.val_annotations, args.val_images, args.split_file)
    if problem:
        raise UsageError(problem)
    from pipeline.local_run import StepFailed, run_local
    from pipeline.params import DEFAULT_REGISTRY_DIR, params_from_args
    params = params_from_args(args)
    params["registry"] = params["registry"] or str(Path(args.pipeline_root, DEFAULT_REGISTRY_DIR).resolve())
    try:
        summary = run_local(params, Path(args.pipeline_root), quiet=not (args.stream_logs or args.verbose))
    except StepFailed as err:
        raise _fail_lines(str(err).splitlines()) from None
    print("\n".join(["", "detpipe run summary", *("  " + line for line in summary.lines())]))
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(
            {k: str(v) if isinstance(v, Path) else v for k, v in summary.__dict__.items()}, indent=2) + "\n")
    return EXIT_OK


def add_run_command(sub) -> None:
    p = sub.add_parser("run", help="run the whole DAG",
                       description="Every pipeline parameter as an option. Each run records a version in the "
                                   "registry (default PIPELINE_ROOT/registry) and compares it with the champion.")
    p.add_argument("--local", action="store_true", help="run with the KFP local runner (SubprocessRunner)")
    add_run_options(p)
    p.add_argument("--pipeline-root", default="local_outputs", help="where artifacts go (default %(default)s)")
    p.add_argument("--summary-json", help="also write the run summary to this JSON file")
    p.add_argument("--verbose", dest="stream_logs", action="store_true",
                   help="stream every step's full output (executor JSON, TensorFlow and Beam logs) instead of one "
                        "line per step; either way it is kept in RUN/logs/STEP.log")
    p.set_defaults(func=cmd_run)
