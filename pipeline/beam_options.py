"""Which of the extra `data build` / `predict --images` arguments Apache Beam does not know.

`detpipe data build` and `detpipe predict --images` pass the arguments they do not define
on to Beam (--project, --region, --temp_location, ...). Beam itself drops unknown ones with a log warning, so a
typo such as `--val-fracton` would pass silently; this asks Beam's own option classes.
"""

from __future__ import annotations


def _option_classes():
    from apache_beam.options.pipeline_options import PipelineOptions

    seen, stack = [], list(PipelineOptions.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.append(cls)
            stack.extend(cls.__subclasses__())
    return seen


def unknown_beam_options(args: list[str]) -> list[str]:
    """The arguments (flags and stray values) no Beam option class accepts."""
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in _option_classes():
        cls._add_argparse_args(parser)
    _, unknown = parser.parse_known_args(args)
    return unknown


def check_beam_args(beam_args: list[str], command: str, options: tuple[str, ...] = ()) -> None:
    """UsageError naming the arguments neither `command` (whose `options` they are) nor Beam
    takes, with the option of `command` one is closest to."""
    import difflib

    from pipeline.cli_types import UsageError

    unknown = unknown_beam_options(beam_args) if beam_args else []
    if unknown:
        close = [(name, found[0]) for name in (arg.split("=", 1)[0] for arg in unknown if arg.startswith("--"))
                 for found in [difflib.get_close_matches(name, options, n=1, cutoff=0.75)] if found]
        guess = "".join(f"; {name}: did you mean {option}?" for name, option in close)
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (neither a `{command}` nor an Apache Beam "
                         f"option{guess})")


def option_strings(parser) -> tuple[str, ...]:
    """Every option `parser` takes, for `check_beam_args`'s guesses."""
    return tuple(option for action in parser._actions for option in action.option_strings)


# The typed Dataflow settings (beam/dataflow.py) as options of `data build` and `predict --images`:
# one option a field, named for it (the image: --worker-image, beside predict's --images).
def _dataflow_option(name: str) -> str:
    return "--worker-image" if name == "image" else "--" + name.replace("_", "-")


def add_dataflow_options(parser) -> None:
    """One option per Dataflow setting, in its own group of `--help`: the pipeline parameter's
    type, check and help (`dataflow_project` → `--project`), the image's own."""
    from dataclasses import fields

    from beam.dataflow import PARAMETER_PREFIX, DataflowSettings
    from pipeline.params import BY_NAME, declared

    group = parser.add_argument_group("Dataflow (with --runner DataflowRunner; checked before the job is submitted)")
    for f in fields(DataflowSettings):
        name = PARAMETER_PREFIX + f.name
        kwargs = declared(name) if name in BY_NAME else {"dest": name, "default": f.default, "help": f.metadata["help"]}
        group.add_argument(_dataflow_option(f.name), metavar=f.name.upper(), **kwargs)


def dataflow_settings(args):
    """The `DataflowSettings` the options of `add_dataflow_options` give."""
    from dataclasses import fields

    from beam.dataflow import PARAMETER_PREFIX, DataflowSettings

    return DataflowSettings(**{f.name: getattr(args, PARAMETER_PREFIX + f.name) for f in fields(DataflowSettings)})


def dataflow_beam_args(args, runner: str, beam_args: list[str]) -> tuple[str, ...]:
    """The Beam arguments of a job: the Dataflow settings the options give, checked (UsageError,
    one line a problem), then the Beam options passed through."""
    from beam.dataflow import problem_lines
    from pipeline.cli_types import UsageError

    settings = dataflow_settings(args)
    lines = problem_lines(settings, runner, beam_args, _dataflow_option, lambda flag, name: (
        f"{flag}: give it as {_dataflow_option(name)}, which is checked before the job is submitted"))
    if lines:
        raise UsageError("\n".join(lines))
    return settings.beam_args() + tuple(beam_args)
