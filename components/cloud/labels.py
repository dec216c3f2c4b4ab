"""Google Cloud labels: the rules a label must follow, the run's own, and the merge every
resource detpipe creates carries.

The rules (https://cloud.google.com/resource-manager/docs/labels-overview#requirements): at
most 64 labels a resource; a key 1-63 characters starting with a lowercase letter; a value
0-63 characters; both of lowercase letters, digits, `_` and `-` (Google also takes
international lowercase letters; detpipe asks for ASCII so a label reads the same in every
console and bill export). Checked here by hand: no Google library exposes the rule.
"""

from __future__ import annotations

import json
import os
import re

APP_LABELS = {"app": "detpipe"}  # what picks detpipe's resources out of a project's
RUN_LABELS_ENV = "VERTEX_AI_PIPELINES_RUN_LABELS"  # a Vertex AI pipeline task's run labels, JSON (GCPC's gcp_labels_util)
MAX_LABELS = 64
MAX_LENGTH = 63
_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


def label_problems(labels: dict[str, str]) -> list[str]:
    """One line a label that breaks Google Cloud's rules (empty: none).

    >>> label_problems({"team": "vision", "Cost": "x", "env": "Prod!"})
    ["label key 'Cost': 1-63 lowercase letters, digits, '_' or '-', starting with a letter", "label env='Prod!': the value must be at most 63 lowercase letters, digits, '_' or '-'"]
    """
    found = []
    for key, value in labels.items():
        if not _KEY.fullmatch(key):
            found.append(f"label key {key!r}: 1-63 lowercase letters, digits, '_' or '-', starting with a letter")
        elif not _VALUE.fullmatch(value):
            found.append(f"label {key}={value!r}: the value must be at most 63 lowercase letters, digits, '_' or '-'")
        elif key in APP_LABELS:
            found.append(f"label key {key!r} is detpipe's own (it picks detpipe's resources out of a project's)")
    if len(labels) + len(APP_LABELS) > MAX_LABELS:
        found.append(f"{len(labels)} labels: a resource takes at most {MAX_LABELS}, detpipe's own included")
    return found


def parse_labels(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`KEY=VALUE` strings as a dict; ValueError with one line a problem.

    >>> parse_labels(["team=vision", "cost_center=cc-42"])
    {'team': 'vision', 'cost_center': 'cc-42'}
    """
    labels, found = {}, []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            found.append(f"label {item!r}: takes KEY=VALUE")
        elif key in labels:
            found.append(f"label key {key!r} given twice")
        else:
            labels[key] = value
    found += label_problems(labels)
    if found:
        raise ValueError("\n".join(found))
    return labels


def run_labels(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The labels of the Vertex AI pipeline run this step belongs to (the billing labels Vertex
    adds among them), from its task's environment; {} outside one or when unreadable."""
    text = (os.environ if environ is None else environ).get(RUN_LABELS_ENV, "")
    try:
        found = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def merged_labels(user: dict[str, str], own: dict[str, str] | None = None,
                  environ: dict[str, str] | None = None) -> dict[str, str]:
    """What a resource carries: the run's labels, then the user's (theirs win, as GCPC's
    launchers do), then detpipe's `APP_LABELS` and the resource's `own` ones.

    >>> merged_labels({"team": "vision"}, {"seed": "0"}, {RUN_LABELS_ENV: '{"billing": "b1", "team": "x"}'})
    {'billing': 'b1', 'team': 'vision', 'app': 'detpipe', 'seed': '0'}
    """
    return {**run_labels(environ), **user, **APP_LABELS, **(own or {})}
