"""Which registry version a training run starts from (the pipeline's `warm_start`,
`detpipe train --init-from`), fetched to a local folder; the trainer then decides whether
that model can be continued (components/train/warm_start.py).

Requests: "auto" (the champion, when there is one), "never", or a version ("v3").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.model_registry.registry import Registry, RegistryError

WARM_START_MODES = ("auto", "never")
DEFAULT_WARM_START = WARM_START_MODES[0]  # the champion, when there is one and it can be continued
_VERSION = re.compile(r"^v\d+$")


@dataclass(frozen=True)
class WarmSource:
    folder: str | None  # local folder with model.keras and train_config.json; None: from scratch
    name: str  # "v3 (the champion)"
    note: str  # why there is no folder
    version: str = ""  # "v3"


def check_request(request: str) -> str:
    """`request` when it is auto, never or a version name; else ValueError."""
    if request in WARM_START_MODES or _VERSION.match(request):
        return request
    raise ValueError(f"warm start must be auto, never or a registry version (v3), got {request!r}")


def warm_source(request: str, registry: Registry | None, champion: str, local_dir: str) -> WarmSource:
    """The weights `request` names, copied to `local_dir`. `champion`: the champion's version
    as the run resolved it at its start ("" for none), so training starts from the model
    evaluation compares with. A version without weights (recorded before they were kept)
    starts from scratch with that reason; a pinned version that does not exist is an error."""
    check_request(request)
    if request == "never":
        return WarmSource(None, "", "warm_start is never")
    if registry is None:
        return WarmSource(None, "", "no registry to take a model from")
    if request == "auto":
        if not champion:
            return WarmSource(None, "", f"no champion in {registry.uri} yet")
        version, name = champion, f"{champion} (the champion)"
    else:
        registry.version(request)  # RegistryError (one line) when there is no such version
        version, name = request, request
    if not registry.fetch_training_files(version, local_dir):
        if request != "auto":
            raise RegistryError(f"version {version} in {registry.uri} has no trained weights (recorded before "
                                "versions kept them): it cannot be continued")
        return WarmSource(None, "", f"champion {version} has no trained weights in the registry (recorded before "
                                    "versions kept them)")
    return WarmSource(local_dir, name, "", version)
