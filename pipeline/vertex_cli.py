"""`detpipe submit | schedule | upload`: the Vertex AI and Artifact Registry commands.

Thin adapters over pipeline/vertex_jobs.py and pipeline/template_registry.py.
"""

from pathlib import Path

from pipeline.cli_types import cron_arg, gs_uri, key_value, kfp_repo
from pipeline.compile_cli import add_compile_options, resources_from_args
from pipeline.cli_types import positive_int as _positive_int

EXIT_OK = 0


def _vertex_target(args):
    from pipeline.vertex_jobs import VertexTarget

    return VertexTarget(project=args.project, region=args.region,
                        pipeline_root=getattr(args, "pipeline_root", None),
                        service_account=getattr(args, "service_account", None))


def _template(args) -> str:
    """The template to run: --template as given, or this checkout compiled now."""
    if args.template:
        return args.template
    import tempfile

    from pipeline.compile import compile_pipeline
    from pipeline.dag import DEFAULT_IMAGE

    path = Path(tempfile.mkdtemp(prefix="detpipe-")) / "detpipe.yaml"
    compile_pipeline(path, image=args.image or DEFAULT_IMAGE, resources=resources_from_args(args))
    return str(path)


def cmd_submit(args) -> int:
    from pipeline.params import typed_values
    from pipeline.vertex_jobs import submit

    params = typed_values(args.param)  # before compiling: a wrong name or value is answered at once
    url = submit(_vertex_target(args), _template(args), params, display_name=args.display_name)
    print(f"submitted: {url}")
    return EXIT_OK


def cmd_schedule(args) -> int:
    from pipeline import vertex_jobs
    from pipeline.params import typed_values

    target = _vertex_target(args)
    if args.action == "create":
        params = typed_values(args.param)
        name = vertex_jobs.create_schedule(target, _template(args), params, args.cron,
                                           display_name=args.display_name, max_concurrent_runs=args.max_concurrent)
        print(f"created schedule {name}")
    elif args.action == "list":
        rows = vertex_jobs.list_schedules(target)
        for row in rows:
            print(f"{row['name']}  {row['state']}  {row['cron']}  {row['display_name']}")
        print(f"{len(rows)} schedule(s)")
    else:
        vertex_jobs.change_schedule(target, args.schedule, args.action)
        print(f"{args.action}d schedule {args.schedule}")
    return EXIT_OK


def cmd_upload(args) -> int:
    from pipeline.template_registry import upload_template

    name, version = upload_template(args.repo, _template(args), args.tag)
    print(f"uploaded {name} version {version} with tags {', '.join(args.tag)}")
    return EXIT_OK


def add_vertex_options(p, root: bool, template: bool = True) -> None:
    p.add_argument("--project", required=True, help="Google Cloud project ID")
    p.add_argument("--region", required=True, help="Vertex AI region, e.g. us-central1")
    if root:
        p.add_argument("--pipeline-root", required=True, type=gs_uri, help="gs:// folder where runs write their artifacts")
        p.add_argument("--service-account", help="service account the run executes as (default: Compute default)")
    if template:
        p.add_argument("--template", help="compiled YAML or https://REGION-kfp.pkg.dev/PROJECT/REPO/detpipe/TAG "
                                          "(default: compile this checkout now, with the options below)")
        add_compile_options(p)
        p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", type=key_value,
                       help="pipeline parameter, repeatable (e.g. --param images=gs://b/imgs --param epochs=20)")


def add_vertex_commands(sub) -> None:
    """Add the submit, schedule and upload subcommands to the `detpipe` parser."""
    p = sub.add_parser("submit", help="submit one run to Vertex AI Pipelines and print its console URL")
    add_vertex_options(p, root=True)
    p.add_argument("--display-name", default="detpipe", help="name of the run in the console (default detpipe)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("schedule", help="create, list, pause, resume or delete Vertex AI pipeline schedules")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION", help="create|list|pause|resume|delete")
    q = actions.add_parser("create", help="run the pipeline on a cron schedule")
    add_vertex_options(q, root=True)
    q.add_argument("--cron", required=True, type=cron_arg, help="five cron fields with an optional TZ= prefix, "
                                                 "e.g. 'TZ=Europe/Berlin 0 3 * * 1'")
    q.add_argument("--display-name", default="detpipe-schedule", help="name of the schedule (default detpipe-schedule)")
    q.add_argument("--max-concurrent", type=_positive_int, default=1, help="runs at once at most (default 1)")
    q.set_defaults(func=cmd_schedule)
    q = actions.add_parser("list", help="list detpipe's schedules in a project and region")
    add_vertex_options(q, root=False, template=False)
    q.set_defaults(func=cmd_schedule)
    for action in ("pause", "resume", "delete"):
        q = actions.add_parser(action, help=f"{action} one schedule")
        add_vertex_options(q, root=False, template=False)
        q.add_argument("schedule", help="schedule ID or full resource name (from `schedule list`)")
        q.set_defaults(func=cmd_schedule)

    p = sub.add_parser("upload", help="upload the pipeline template to Artifact Registry (a KFP repository)")
    p.add_argument("--repo", required=True, type=kfp_repo, help="https://REGION-kfp.pkg.dev/PROJECT/REPO")
    p.add_argument("--tag", action="append", required=True, help="tag of this version, repeatable (e.g. v3, latest)")
    p.add_argument("--template", help="compiled YAML to upload (default: compile this checkout now, with the "
                                      "options below)")
    add_compile_options(p)
    p.set_defaults(func=cmd_upload)


def cloud_error_line(err: Exception) -> str | None:
    """A one-line message for credential and API errors from the Google Cloud clients."""
    module = type(err).__module__
    if module.startswith("google.auth"):
        return ("no usable Google Cloud credentials: run `gcloud auth application-default login` or set "
                f"GOOGLE_APPLICATION_CREDENTIALS ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    if module.startswith(("google.api_core", "requests")):
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'request failed'}"
    return None
