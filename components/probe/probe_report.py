"""Run the probe: collect facts, check them, write `probe.json` and `probe.md`."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from components.probe.checks import CheckResult, run_checks, verdict
from components.probe.machine_facts import collect

logger = logging.getLogger(__name__)


@dataclass
class ProbeResult:
    verdict: str
    checks: list[CheckResult]
    facts: dict

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "checks": [c.to_dict() for c in self.checks], "facts": self.facts}


def run_probe(require_gpu: bool = False, facts: dict | None = None) -> ProbeResult:
    facts = collect() if facts is None else facts
    checks = run_checks(facts, require_gpu=require_gpu)
    return ProbeResult(verdict(checks), checks, facts)


def probe_markdown(result: ProbeResult) -> str:
    facts = result.facts
    tf_facts = facts["tensorflow"]
    build = tf_facts["build"]
    lines = [
        f"# Environment probe: {result.verdict}", "",
        "| check | status | reason | fix |", "|---|---|---|---|",
        *[f"| {c.name} | {c.status} | {c.reason} | {c.fix} |" for c in result.checks],
        "", "| fact | value |", "|---|---|",
        f"| TensorFlow | {tf_facts['version']} (CUDA build: {build.get('is_cuda_build', False)}, "
        f"CUDA {build.get('cuda_version', '-')}, cuDNN {build.get('cudnn_version', '-')}) |",
        f"| GPUs | {len(tf_facts['gpus'])} |",
        f"| CPUs usable / visible | {facts['cpu']['usable']} / {facts['cpu']['visible']} |",
        f"| RAM total / available | {_gib(facts['memory'].get('total'))} / {_gib(facts['memory'].get('available'))} |",
        f"| Python | {facts['python']} |",
    ]
    return "\n".join(lines) + "\n"


def _gib(value: int | None) -> str:
    return "unknown" if not value else f"{value / (1 << 30):.1f} GiB"


def write_probe(result: ProbeResult, json_path: Path | None, markdown_path: Path | None) -> None:
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    if markdown_path:
        Path(markdown_path).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown_path).write_text(probe_markdown(result))
