"""`detpipe registry list | show VERSION | promote VERSION --reason TEXT`: look into the
model registry, and pin or roll back the champion by hand (the reason is recorded; with
`--vertex-model [--endpoint]` on Vertex AI too, components/model_registry/rollback.py).

Reads only JSON files: no TensorFlow is imported, so these answer at once.
"""

from __future__ import annotations

import getpass
import json
import socket

from components.model_registry.vertex_model import DEFAULT_MACHINE_TYPE, DEFAULT_REGION
from pipeline.params import declared

EXIT_OK = 0
DEFAULT_REGISTRY = "local_outputs/registry"  # where `detpipe run --local` puts it by default


def _registry(args):
    from components.model_registry.registry import Registry

    return Registry.open(args.registry, args.model_name)


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def cmd_list(args) -> int:
    registry = _registry(args)
    versions = registry.versions()
    champion = registry.champion_version()
    if not versions:
        print(f"no versions in {registry.uri} yet (a pipeline run records one)")
        return EXIT_OK
    print(f"{registry.uri} (champion: {champion or 'none'})")
    print(f"  {'version':<9} {'status':<10} {'mAP':>6} {'AP50':>6}  {'created':<25} {'data':<12} run")
    for v in versions:
        mark = "*" if v["version"] == champion else " "
        metrics = v.get("metrics", {})
        print(f"{mark} {v['version']:<9} {v.get('status', '?'):<10} {_fmt(metrics.get('mAP')):>6} "
              f"{_fmt(metrics.get('AP50')):>6}  {v.get('created', v.get('claimed', '')):<25} "
              f"{v.get('fingerprint', {}).get('sha256', '')[:12]:<12} {v.get('run_id', '')}")
    return EXIT_OK


def cmd_show(args) -> int:
    from components.model_registry.decision import DECISION_FILE, DecisionRecord, comparison_line

    registry = _registry(args)
    version = registry.version(args.version)
    champion = registry.champion()
    print(json.dumps(version, indent=2, sort_keys=True))
    text = registry.read_file(args.version, DECISION_FILE)
    if text:
        print(f"decision: {comparison_line(DecisionRecord.from_dict(json.loads(text)))}")
    if champion and champion["version"] == args.version:
        print(f"{args.version} is the champion since {champion['since']} ({champion['by']}: {champion['reason']})")
    if args.vertex_model:
        print(_vertex_evaluation(args))
    return EXIT_OK


def _vertex_evaluation(args) -> str:
    """The line of the evaluation Vertex AI holds for the version uploaded for args.version."""
    from components.register.vertex_evaluation import evaluation_line, read_evaluation
    from components.model_registry.vertex_model import model_api, model_resource, vertex_version_of

    if not args.project:
        raise ValueError("--vertex-model needs --project")
    model = model_resource(args.vertex_model, args.project, args.region)
    version = vertex_version_of(model, args.version, args.region)
    found = read_evaluation(version, model_api(args.region))
    return f"{version}: {evaluation_line(found)}" if found else f"{version}: no evaluation imported"


def _vertex_promotion(args):
    from components.model_registry.rollback import VertexPromotion

    if not args.vertex_model:
        if args.endpoint:
            raise ValueError("--endpoint needs --vertex-model (the Vertex AI model whose version it serves)")
        return None
    if not args.project:
        raise ValueError("--vertex-model needs --project")
    return VertexPromotion(args.vertex_model, args.project, args.region, args.endpoint, args.machine_type,
                           args.accelerator, args.min_replicas, args.max_replicas)


def cmd_promote(args) -> int:
    registry = _registry(args)
    registry.promotable(args.version)  # an unknown or unfinished version fails here, before anything moves
    promotion = _vertex_promotion(args)
    current = registry.champion_version() or None
    if promotion is not None:
        from components.model_registry.rollback import promote_on_vertex

        served = promote_on_vertex(promotion, args.version)
        where = f" and serves all traffic of endpoint {promotion.endpoint}" if promotion.endpoint else ""
        print(f"Vertex AI: {served} is the champion (aliases champion, default){where}")
    if current == args.version:
        print(f"{args.version} is already the champion")
        return EXIT_OK
    by = f"detpipe registry promote ({getpass.getuser()}@{socket.gethostname()})"
    registry.set_champion(args.version, args.reason, by=by, expected=current)
    print(f"champion: {current or 'none'} -> {args.version} ({args.reason}); the next run compares with it")
    return EXIT_OK


def add_registry_commands(sub) -> None:
    parser = sub.add_parser("registry", help="list model versions, show one, promote one by hand",
                            description="The registry a pipeline run records each model version in: "
                                        "REGISTRY/MODEL_NAME/versions/vN and champion.json.")
    commands = parser.add_subparsers(dest="registry_command", required=True, metavar="REGISTRY_COMMAND",
                                     help="list, show or promote")

    def common(p):
        p.add_argument("--registry", default=DEFAULT_REGISTRY,
                       help="registry folder, local or gs:// (default %(default)s, that of `detpipe run "
                            "--local`)")
        p.add_argument("--model-name", **declared("model_name"))

    p = commands.add_parser("list", help="every version with its status and scores; * marks the champion")
    common(p)
    p.set_defaults(func=cmd_list)
    p = commands.add_parser("show", help="one version's record and decision (and, with --vertex-model, the "
                                         "evaluation the Vertex AI Model Registry holds for it)")
    p.add_argument("version", help="e.g. v3")
    common(p)
    vertex = p.add_argument_group("Vertex AI")
    vertex.add_argument("--vertex-model", **declared("vertex_model", help="Vertex AI model the pipeline uploads to: "
                                                                       "display name or projects/P/locations/L/models/ID"))
    vertex.add_argument("--project", default="", help="Google Cloud project (with --vertex-model)")
    vertex.add_argument("--region", default=DEFAULT_REGION, help="Vertex AI region (default %(default)s)")
    p.set_defaults(func=cmd_show)
    p = commands.add_parser("promote", help="make a version the champion by hand (pin or roll back)",
                            description="Make VERSION the champion: the next run compares with it, a warm start "
                                        "continues it and the batch-predict pipeline predicts with it. With "
                                        "--vertex-model, also on Vertex AI: its version of VERSION gets the "
                                        "champion and default aliases; with --endpoint it is first deployed there "
                                        "and gets all traffic once it answers its health route (the earlier model "
                                        "keeps serving if that fails, and nothing moves).")
    p.add_argument("version", help="e.g. v3")
    p.add_argument("--reason", required=True, help="why, recorded in champion.json")
    common(p)
    vertex = p.add_argument_group("Vertex AI (as the pipeline's vertex_model and vertex_endpoint)")
    vertex.add_argument("--vertex-model", **declared("vertex_model", help="Vertex AI model the pipeline uploads to: "
                                                                       "display name or projects/P/locations/L/models/ID"))
    vertex.add_argument("--project", default="", help="Google Cloud project (with --vertex-model)")
    vertex.add_argument("--region", default=DEFAULT_REGION, help="Vertex AI region (default %(default)s)")
    vertex.add_argument("--endpoint", default="", help="endpoint display name: redeploy VERSION there")
    vertex.add_argument("--machine-type", help="machines that serve (default: as the endpoint serves now, "
                                               f"else {DEFAULT_MACHINE_TYPE})")
    vertex.add_argument("--accelerator", metavar="TYPE[:COUNT]",
                        help="GPUs per machine, '' for none (default: as the endpoint serves now)")
    vertex.add_argument("--min-replicas", type=int, help="machines at least (default: as now, else 1)")
    vertex.add_argument("--max-replicas", type=int, help="machines at most (default: as now, else 1)")
    p.set_defaults(func=cmd_promote)
