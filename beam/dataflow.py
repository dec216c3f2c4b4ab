"""Where a Beam job of detpipe runs on Dataflow: its settings, declared once, here.

The data job (`data build`, the pipeline's validate-and-convert step) and the batch prediction
job (`predict --images`, the batch-predict pipeline) take the same settings: each command's
options and each pipeline's parameters are made from these fields (their help included), and
`problems` checks them before anything is submitted, one line a problem. Everything else Beam
takes still passes through as Beam's own options.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields

DATAFLOW_RUNNER = "DataflowRunner"
RUNNERS = ("DirectRunner", DATAFLOW_RUNNER)  # where detpipe's Beam jobs run (the runner option's choices)
PARAMETER_PREFIX = "dataflow_"  # a pipeline's parameter for a setting: dataflow_project, ...


def _setting(help: str, *beam_flags: str, default=""):
    """A field with its help and the Beam options that set it (the first is the one written)."""
    return field(default=default, metadata={"help": help, "beam": beam_flags})


@dataclass(frozen=True)
class DataflowSettings:
    project: str = _setting("Google Cloud project of the Dataflow job.", "project")
    region: str = _setting("Region of the Dataflow job, e.g. us-central1.", "region")
    temp_location: str = _setting("gs:// folder for the Dataflow job's temporary and staged files.", "temp_location")
    machine_type: str = _setting("Machine type of the Dataflow workers, e.g. n1-standard-4; empty: Dataflow's default.",
                                 "machine_type", "worker_machine_type")
    max_workers: int = _setting("Dataflow workers at most (autoscaling up to it); 0: Dataflow's default.",
                                "max_num_workers", default=0)
    service_account: str = _setting("Service account the Dataflow workers run as; empty: the project's "
                                    "Compute Engine default.", "service_account_email")
    network: str = _setting("VPC network of the Dataflow workers; empty: default.", "network")
    subnetwork: str = _setting("Subnetwork of the Dataflow workers: regions/REGION/subnetworks/NAME or its full "
                               "URL; empty: the network's.", "subnetwork")
    image: str = _setting("The Dataflow workers' container image: the project image (infra/Dockerfile), whose "
                          "entrypoint starts Beam's workers.", "sdk_container_image", "worker_harness_container_image")

    def given(self) -> list[str]:
        """The fields set to something other than their default."""
        return [f.name for f in fields(self) if getattr(self, f.name) != f.default]

    def problems(self, runner: str) -> list[tuple[str, str]]:
        """(field, what is wrong) for every setting Dataflow would refuse or a job could not use;
        none with another runner unless a setting is given for nothing."""
        if runner != DATAFLOW_RUNNER:
            return [(name, f"applies to {DATAFLOW_RUNNER} only (the runner is {runner})") for name in self.given()]
        found = [(name, f"required on {DATAFLOW_RUNNER}") for name in ("project", "region", "temp_location", "image")
                 if not getattr(self, name)]
        if self.temp_location and not self.temp_location.startswith("gs://"):
            found.append(("temp_location", f"must be a gs:// folder, got {self.temp_location!r}"))
        if self.max_workers < 0:
            found.append(("max_workers", f"must be 0 or more, got {self.max_workers}"))
        if self.service_account and not _SERVICE_ACCOUNT.fullmatch(self.service_account):
            found.append(("service_account", f"must be an email NAME@PROJECT.iam.gserviceaccount.com, got "
                                             f"{self.service_account!r}"))
        if self.subnetwork and not _SUBNETWORK.fullmatch(self.subnetwork):
            found.append(("subnetwork", f"must be regions/REGION/subnetworks/NAME or a full URL, got "
                                        f"{self.subnetwork!r}"))
        if self.project and not _PROJECT.fullmatch(self.project):
            found.append(("project", f"is not a Google Cloud project ID: {self.project!r}"))
        return found

    def beam_args(self) -> tuple[str, ...]:
        """Beam's options for the settings that are given.

        >>> DataflowSettings(project="p", region="r", max_workers=4, image="i:1").beam_args()
        ('--project=p', '--region=r', '--max_num_workers=4', '--sdk_container_image=i:1')
        """
        return tuple(f"--{f.metadata['beam'][0]}={getattr(self, f.name)}" for f in fields(self)
                     if getattr(self, f.name) != f.default)


def beam_flags_of_settings(beam_args) -> list[tuple[str, str]]:
    """(field, Beam option) for each Beam option among `beam_args` that sets one of the typed
    settings: those are given as the settings, so that they are checked.

    >>> beam_flags_of_settings(["--temp_location=gs://b", "--streaming", "--worker_machine_type", "n2"])
    [('temp_location', '--temp_location'), ('machine_type', '--worker_machine_type')]
    """
    by_flag = {f"--{flag}": f.name for f in fields(DataflowSettings) for flag in f.metadata["beam"]}
    found = []
    for arg in beam_args:
        flag = arg.split("=", 1)[0]
        if flag in by_flag:
            found.append((by_flag[flag], flag))
    return found


def problem_lines(settings: DataflowSettings, runner: str, beam_args, named: Callable[[str], str],
                  instead: Callable[[str, str], str]) -> list[str]:
    """What is wrong, one line a problem: each setting Dataflow would refuse, as the user named
    it (`named(field)`: an option or a parameter), and each Beam option among `beam_args` that
    sets a checked setting (`instead(flag, field)`: that line)."""
    lines = [f"{named(name)}: {text}" for name, text in settings.problems(runner)]
    lines += [instead(flag, name) for name, flag in beam_flags_of_settings(beam_args)]
    return lines


def pipeline_settings(parameters: dict, runner: str, image: str, beam_options: str) -> tuple[DataflowSettings, list[str]]:
    """A pipeline step's settings from its `dataflow_*` parameters, on the step's own `image`
    when it runs on Dataflow, and what is wrong with them or with `beam_options`, one line a
    problem naming the parameter (the step checks, and `submit` before submitting)."""
    import shlex

    settings = DataflowSettings(**{name.removeprefix(PARAMETER_PREFIX): value for name, value in parameters.items()},
                                image=image if runner == DATAFLOW_RUNNER else "")
    def instead(flag: str, name: str) -> str:
        if name == "image":  # no parameter: the workers run the step's own image, the one compiled in
            return f"beam_options {flag}: give it as the pipeline's --image at compile time: the workers run the " \
                   "step's own image"
        return f"beam_options {flag}: give it as the parameter {PARAMETER_PREFIX}{name}, which is checked"

    return settings, problem_lines(settings, runner, shlex.split(beam_options), lambda name: PARAMETER_PREFIX + name,
                                   instead)


# Google Cloud's own rules for the names (project IDs: 6-30 characters, lower case letters,
# digits and hyphens, a letter first; a domain-scoped `example.com:project` too).
_PROJECT = re.compile(r"([a-z0-9.-]+\.[a-z]{2,}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]")
_SERVICE_ACCOUNT = re.compile(r"[^@\s]+@[^@\s]+\.[a-z]{2,}")
_SUBNETWORK = re.compile(r"(https://www\.googleapis\.com/compute/v1/projects/[^/\s]+/)?regions/[a-z0-9-]+/"
                         r"subnetworks/[a-z0-9-]+")
