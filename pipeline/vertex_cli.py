"""`detpipe submit | schedule | upload | batch-predict | deploy`: the Vertex AI and Artifact
Registry commands.

Thin adapters over pipeline/vertex_jobs.py, pipeline/template_registry.py and
components/model_registry (vertex_batch.py, vertex_endpoint.py).
"""

from pathlib import Path

from components.model_registry.vertex_model import DEFAULT_MACHINE_TYPE, DEFAULT_REGION
from pipeline.cli_types import UsageError, cron_arg, gs_uri, key_value, kfp_repo
from pipeline.cli_types import positive_int as _positive_int
from pipeline.compile_cli import add_cloud_options, add_compile_options, cloud_from_args, resources_from_args

EXIT_OK = 0


def _cloud(args):
    """The --label/--kms-key/--network settings (bad ones: one line each, exit 2)."""
    from components.cloud.resources import CloudSettings

    if not hasattr(args, "label"):
        return CloudSettings()
    try:
        return cloud_from_args(args)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _vertex_target(args):
    from pipeline.vertex_jobs import VertexTarget

    return VertexTarget(project=args.project, region=args.region,
                        pipeline_root=getattr(args, "pipeline_root", None),
                        service_account=getattr(args, "service_account", None), cloud=_cloud(args))


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


def _experiment(args, params: dict) -> str:
    """The experiment the run joins: --experiment, else one named for the model (the
    model_name parameter); "" with --no-experiment."""
    from components.model_registry.vertex_experiment import experiment_name, experiment_problem
    from pipeline.params import BY_NAME

    if "experiment" in params:
        raise UsageError("give the experiment as --experiment (or --no-experiment), not --param experiment")
    if args.no_experiment:
        return ""
    name = args.join_experiment or experiment_name(str(params.get("model_name", BY_NAME["model_name"].default)))
    problem = experiment_problem(name)
    if problem:
        raise UsageError(f"--experiment: {problem}")
    return name


def cmd_submit(args) -> int:
    from pipeline.params import typed_values
    from pipeline.vertex_jobs import submit

    params = typed_values(args.param)  # before compiling: a wrong name or value is answered at once
    experiment = _experiment(args, params)
    url = submit(_vertex_target(args), _template(args), params, display_name=args.display_name,
                 experiment=experiment)
    print(f"submitted: {url}" + (f" (a run of experiment {experiment})" if experiment else ""))
    return EXIT_OK


def cmd_schedule(args) -> int:
    from pipeline import vertex_jobs
    from pipeline.params import typed_values

    target = _vertex_target(args)
    if args.action == "create":
        params = typed_values(args.param)
        experiment = _experiment(args, params)
        if experiment:  # each run's register step joins it (Vertex AI's schedules have no experiment)
            params["experiment"] = experiment
        template = _template(args)
        release = vertex_jobs.release_of(template)
        print(f"schedule {args.display_name}: freezing {release.line()}", flush=True)
        name = vertex_jobs.create_schedule(target, template, params, args.cron, display_name=args.display_name,
                                           max_concurrent_runs=args.max_concurrent, release=release)
        print(f"created schedule {name}: it runs release {release.label} until `detpipe schedule update "
              f"{name.rsplit('/', 1)[-1]} --template URI` moves it")
    elif args.action == "list":
        rows = vertex_jobs.list_schedules(target)
        for row in rows:
            print(f"{row['name']}  {row['state']}  cron {row['cron']!r}  next {row['next_run']}  "
                  f"release {row['release']}  {row['runs']} run(s)  {row['display_name']}  ({row['template']})")
        print(f"{len(rows)} detpipe schedule(s)")
    elif args.action == "update":
        moved = vertex_jobs.update_schedule(target, args.schedule, args.template)
        print(f"moved schedule {moved.old} from release {moved.old_release} to {moved.release.line()}: it is now "
              f"{moved.new} (same cron, parameters and remaining runs); the old one was deleted")
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


def _add_experiment_options(p) -> None:
    p.add_argument("--experiment", dest="join_experiment", metavar="NAME",
                   help="Vertex AI Experiments experiment the run(s) join, created when missing, to compare them "
                        "there (default: named for the model_name parameter)")
    p.add_argument("--no-experiment", action="store_true", help="join no experiment")


def _vertex_model(args) -> str:
    """--model as a resource name at the champion alias unless it names a version: a
    display name is looked up (its newest model)."""
    from components.model_registry.vertex_batch import champion_of
    from components.model_registry.vertex_model import model_resource

    return champion_of(model_resource(args.model, project=args.project, location=args.region))


def cmd_batch_predict(args) -> int:
    from components.model_registry.vertex_batch import BatchPredictionSpec, submit_batch_prediction
    from components.model_registry.vertex_endpoint import parse_accelerator

    kind, count = parse_accelerator(args.accelerator)
    spec = BatchPredictionSpec(model=_vertex_model(args), source=args.source, destination=args.destination,
                               instances_format=args.instances_format, machine_type=args.machine_type,
                               accelerator_type=kind, accelerator_count=count, replicas=args.replicas,
                               score_threshold=args.score_threshold)
    job = submit_batch_prediction(spec, project=args.project, location=args.region, cloud=_cloud(args))
    job.wait_for_resource_creation()
    print(f"batch prediction job {job.resource_name} with {spec.model}: predictions under {args.destination}")
    return EXIT_OK


def cmd_deploy(args) -> int:
    from components.model_registry.vertex_endpoint import EndpointSpec, deploy_to_endpoint, parse_accelerator

    kind, count = parse_accelerator(args.accelerator)
    model = _vertex_model(args)
    deployed = deploy_to_endpoint(model, EndpointSpec(args.endpoint, args.machine_type, kind, count,
                                                      args.min_replicas, args.max_replicas),
                                  project=args.project, location=args.region, cloud=_cloud(args))
    print(f"{model} serves all traffic of endpoint {args.endpoint} (deployed model {deployed.deployed_model_id}); earlier "
          "deployments were removed once it answered its health route")
    return EXIT_OK


def _add_machine_options(p, what: str) -> None:
    p.add_argument("--project", required=True, help="Google Cloud project")
    p.add_argument("--region", default=DEFAULT_REGION, help="Vertex AI region (default %(default)s)")
    p.add_argument("--model", required=True,
                   help="Vertex AI model: its display name (the pipeline's vertex_model; the champion version) "
                        "or a resource name projects/P/locations/L/models/ID[@VERSION|@ALIAS]")
    p.add_argument("--machine-type", default=DEFAULT_MACHINE_TYPE, help=f"machines {what} (default %(default)s)")
    p.add_argument("--accelerator", default="", metavar="TYPE[:COUNT]",
                   help="GPUs per machine, e.g. NVIDIA_TESLA_T4:1 (default none)")
    add_cloud_options(p, network=False)


def add_vertex_commands(sub) -> None:
    """Add submit, schedule, batch-predict, deploy and upload to the `detpipe` parser."""
    _add_run_commands(sub)
    _add_model_commands(sub)
    p = sub.add_parser("upload", help="upload the pipeline template to Artifact Registry (a KFP repository)")
    p.add_argument("--repo", required=True, type=kfp_repo, help="https://REGION-kfp.pkg.dev/PROJECT/REPO")
    p.add_argument("--tag", action="append", required=True, help="tag of this version, repeatable (e.g. v3, latest)")
    p.add_argument("--template", help="compiled YAML to upload (default: compile this checkout now, with the "
                                      "options below)")
    add_compile_options(p)
    p.set_defaults(func=cmd_upload)


def _add_run_commands(sub) -> None:
    p = sub.add_parser("submit", help="submit one run to Vertex AI Pipelines and print its console URL")
    add_vertex_options(p, root=True)
    _add_experiment_options(p)
    p.add_argument("--display-name", default="detpipe", help="name of the run in the console (default %(default)s)")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("schedule", help="create, list, update, pause, resume or delete Vertex AI pipeline schedules")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION",
                               help="create|list|update|pause|resume|delete")
    q = actions.add_parser("create", help="run the pipeline on a cron schedule")
    add_vertex_options(q, root=True)
    _add_experiment_options(q)
    q.add_argument("--cron", required=True, type=cron_arg, help="five cron fields with an optional TZ= prefix, "
                                                 "e.g. 'TZ=Europe/Berlin 0 3 * * 1'")
    q.add_argument("--display-name", default="detpipe-schedule", help="name of the schedule (default %(default)s)")
    q.add_argument("--max-concurrent", type=_positive_int, default=1, help="runs at once at most (default %(default)s)")
    q.set_defaults(func=cmd_schedule)
    q = actions.add_parser("list", help="list detpipe's schedules in a project and region, each with its cron, "
                                        "state, next run and the release it runs")
    add_vertex_options(q, root=False, template=False)
    q.set_defaults(func=cmd_schedule)
    q = actions.add_parser("update", help="move a schedule to another release of the pipeline",
                           description="A schedule runs the compiled pipeline it was created with, whatever is "
                                       "uploaded since. This moves it to --template: a new schedule with the same "
                                       "cron, display name, parameters, service account, labels, key and remaining "
                                       "runs (the API cannot change a schedule's pipeline in place), then the old "
                                       "one is deleted.")
    add_vertex_options(q, root=False, template=False)
    q.add_argument("schedule", help="schedule ID or full resource name (from `schedule list`)")
    q.add_argument("--template", required=True,
                   help="the release to run: compiled YAML or https://REGION-kfp.pkg.dev/PROJECT/REPO/detpipe/TAG "
                        "(a tag is resolved to its version now)")
    q.set_defaults(func=cmd_schedule)
    for action in ("pause", "resume", "delete"):
        q = actions.add_parser(action, help=f"{action} one schedule")
        add_vertex_options(q, root=False, template=False)
        q.add_argument("schedule", help="schedule ID or full resource name (from `schedule list`)")
        q.set_defaults(func=cmd_schedule)


def _add_model_commands(sub) -> None:
    p = sub.add_parser("batch-predict", help="a Vertex AI batch prediction job with the champion (--vertex)",
                       description="Vertex AI batch prediction with a model of the Vertex AI Model Registry (the "
                                   "champion unless --model names a version), on machines running the project "
                                   "image with `detpipe serve`. For a Beam job over a folder or bucket, locally or "
                                   "on Dataflow, use `detpipe predict --images`.")
    p.add_argument("--vertex", action="store_true", required=True, help="run it as a Vertex AI batch prediction job")
    _add_machine_options(p, "that predict")
    p.add_argument("--source", required=True, type=gs_uri,
                   help="gs:// file: image URIs, one a line (--instances-format file-list), or JSON Lines of "
                        '{"image_bytes": {"b64": ...}} (jsonl)')
    p.add_argument("--destination", required=True, type=gs_uri, help="gs:// prefix for the predictions (JSON Lines)")
    p.add_argument("--instances-format", choices=("file-list", "jsonl"), default="file-list",
                   help="what --source holds (default %(default)s)")
    p.add_argument("--replicas", type=_positive_int, default=1, help="machines (default %(default)s)")
    p.add_argument("--score-threshold", type=float, help="keep detections scoring at least this (default: the export's)")
    p.set_defaults(func=cmd_batch_predict)

    p = sub.add_parser("deploy", help="put the champion behind a Vertex AI endpoint",
                       description="Deploy a Vertex AI Model Registry version (the champion unless --model names a "
                                   "version) to the endpoint named --endpoint (created when missing), move all "
                                   "traffic to it once it answers its health route, then undeploy what the endpoint "
                                   "served before. A failed deployment leaves the previous one serving. To roll "
                                   "back, `detpipe registry promote VERSION --vertex-model NAME --endpoint E` "
                                   "moves the champion everywhere.")
    _add_machine_options(p, "that serve")
    p.add_argument("--endpoint", required=True, help="endpoint display name")
    p.add_argument("--min-replicas", type=_positive_int, default=1, help="machines at least (default %(default)s)")
    p.add_argument("--max-replicas", type=_positive_int, default=1, help="machines at most: autoscaling (default %(default)s)")
    p.set_defaults(func=cmd_deploy)


def cloud_error_line(err: Exception) -> str | None:
    """A one-line message for credential and API errors from the Google Cloud clients."""
    module = type(err).__module__
    if module.startswith("google.auth"):
        return ("no usable Google Cloud credentials: run `gcloud auth application-default login` or set "
                f"GOOGLE_APPLICATION_CREDENTIALS ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})")
    if module.startswith(("google.api_core", "requests")):
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'request failed'}"
    return None
