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


def check_beam_args(beam_args: list[str], command: str) -> None:
    """UsageError naming the arguments neither `command` nor Beam takes."""
    from pipeline.cli_types import UsageError

    unknown = unknown_beam_options(beam_args) if beam_args else []
    if unknown:
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (neither a `{command}` nor an Apache Beam "
                         "option)")
