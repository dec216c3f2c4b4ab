"""`detpipe compile` and the compile-time options `submit`, `schedule create` and `upload`
share when they compile the pipeline on the fly: the machines of each step, and whether tune
and train run as pipeline tasks or as Vertex AI custom jobs (several replicas, spot VMs)."""

from __future__ import annotations

from pathlib import Path

from pipeline.cli_types import cpu_arg, duration_arg, memory_arg, non_negative_int, output_file, positive_int

EXIT_OK = 0


def add_cloud_options(p, network: bool = True) -> None:
    """--label, --kms-key and (`network`) --network: `cloud_from_args` reads them."""
    from components.cloud.resources import KMS_KEY_FORM, NETWORK_FORM

    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="a label on the run and on every resource it creates on Google Cloud (custom jobs, the "
                        "Dataflow and tuning jobs, models, endpoints, batch jobs), beside the run's own labels; "
                        "repeatable; lowercase letters, digits, '_' and '-'")
    p.add_argument("--kms-key", default="", metavar=KMS_KEY_FORM,
                   help="a Cloud KMS key that encrypts the run and what it creates (default: Google-managed)")
    if network:
        p.add_argument("--network", default="", metavar=NETWORK_FORM,
                       help="a VPC network the run and its custom jobs are peered with (default none; Dataflow's "
                            "is the dataflow_network parameter)")


def add_compile_options(p) -> None:
    from pipeline.vertex_jobs import MAX_NOTIFY

    p.add_argument("--image", default=None, help="container image of every step (default detpipe:latest)")
    p.add_argument("--data-cpu", default="4", type=cpu_arg, help="CPU limit of the data step (default %(default)s)")
    p.add_argument("--data-memory", default="16G", type=memory_arg, help="memory limit of the data step (default %(default)s)")
    p.add_argument("--accelerator-type", default="NVIDIA_TESLA_T4",
                   help="GPU of the probe and train steps, a Vertex accelerator name (default %(default)s)")
    p.add_argument("--accelerator-count", type=positive_int, default=1, help="GPUs per probe/train step (default %(default)s)")
    p.add_argument("--train-cpu", default="8", type=cpu_arg, help="CPU limit of the probe and train steps (default %(default)s)")
    p.add_argument("--train-memory", default="32G", type=memory_arg,
                   help="memory limit of the probe and train steps (default %(default)s)")
    p.add_argument("--evaluate-on-gpu", action="store_true", help="run evaluation on the accelerator too")
    p.add_argument("--train-retries", type=non_negative_int, default=2,
                   help="retries of the train step after preemption (default %(default)s)")
    p.add_argument("--train-runner", choices=("task", "customjob"), default="task",
                   help="tune and train as pipeline tasks on one VM (task, default) or as Vertex AI custom jobs "
                        "(customjob: replicas, spot VMs, timeout); `detpipe run --local` always uses task")
    p.add_argument("--train-replicas", type=positive_int, default=1,
                   help="customjob: machines for training, 1 chief + N-1 workers, trained in lockstep with "
                        "MultiWorkerMirroredStrategy; --batch-size is per machine (default %(default)s)")
    p.add_argument("--train-machine-type", default="n1-standard-8",
                   help="customjob: machine type of every replica (default %(default)s)")
    p.add_argument("--spot", action="store_true", help="customjob: spot VMs (cheaper; on the SIGTERM before a "
                                                       "preemption every replica saves a checkpoint at the current "
                                                       "step, and the restarted job resumes from it)")
    p.add_argument("--train-timeout", type=duration_arg, default=7 * 24 * 3600,
                   help="customjob: the job's time limit, e.g. 24h, 90m, 2d (default 7d)")
    p.add_argument("--restart-on-worker-restart", action="store_true",
                   help="customjob: restart every replica when one restarts")
    p.add_argument("--tensorboard", default="", metavar="projects/P/locations/L/tensorboards/ID",
                   help="a Vertex AI TensorBoard for the training curves: a custom job (with --job-output-dir) "
                        "streams them there, a train task uploads them when training ends")
    p.add_argument("--job-output-dir", default="", metavar="gs://BUCKET/PATH",
                   help="customjob: where Vertex AI writes the jobs' outputs (their base output directory)")
    p.add_argument("--job-service-account", default="",
                   help="customjob: service account of the custom jobs (default: the run's)")
    add_cloud_options(p)
    p.add_argument("--notify", action="append", default=[], metavar="EMAIL",
                   help=f"email EMAIL when a run ends, failed or not (Vertex AI's notification in an exit handler); "
                        f"repeatable, at most {MAX_NOTIFY}")


def cloud_from_args(args):
    """The labels, key and network the options give (`CloudSettings`; bad ones: ValueError,
    one line a problem)."""
    from components.cloud.labels import parse_labels
    from components.cloud.resources import CloudSettings

    return CloudSettings(parse_labels(args.label), args.kms_key, getattr(args, "network", ""))


def resources_from_args(args):
    """The `StepResources` the options ask for (a bad combination: one line, exit 2)."""
    from pipeline.cli_types import UsageError
    from pipeline.dag import StepResources

    try:
        return StepResources(
            data_cpu=args.data_cpu, data_memory=args.data_memory, accelerator_type=args.accelerator_type,
            accelerator_count=args.accelerator_count, train_cpu=args.train_cpu, train_memory=args.train_memory,
            evaluate_on_gpu=args.evaluate_on_gpu, train_retries=args.train_retries, train_runner=args.train_runner,
            train_replicas=args.train_replicas, train_machine_type=args.train_machine_type, spot=args.spot,
            train_timeout_s=args.train_timeout, restart_on_worker_restart=args.restart_on_worker_restart,
            tensorboard=args.tensorboard, job_output_dir=args.job_output_dir,
            service_account=args.job_service_account, notify=tuple(args.notify), cloud=cloud_from_args(args))
    except ValueError as err:
        raise UsageError(str(err)) from None


def cmd_compile(args) -> int:
    from pipeline.compile import compile_pipeline
    from pipeline.dag import DEFAULT_IMAGE

    print(compile_pipeline(Path(args.output), image=args.image or DEFAULT_IMAGE, resources=resources_from_args(args),
                           pipeline=args.pipeline))
    return EXIT_OK


def add_compile_command(sub) -> None:
    p = sub.add_parser("compile", help="compile the pipeline YAML and print its sha256")
    p.add_argument("--output", default="detpipe.yaml", type=output_file,
                   help="YAML file to write (default %(default)s)")
    p.add_argument("--pipeline", choices=("detpipe", "batch-predict"), default="detpipe",
                   help="detpipe (default): train, evaluate and register; batch-predict: predict every image under "
                        "a folder or gs:// prefix with the registry's champion (its step has no accelerator)")
    add_compile_options(p)
    p.set_defaults(func=cmd_compile)
