"""Run the probe: collect facts, check them, recommend settings for training, compare
with a baseline, and write `probe.json` and `probe.md`."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from beam.contract.data_text import markdown_text
from components.detector.precision import precision_for
from components.probe.baseline_diff import compare_facts, difference_lines
from components.probe.checks import FAIL, PASS, WARN, CheckResult, Expectations, check_gpu_memory, run_checks, verdict
from components.probe.machine_facts import collect
from components.train.config import TrainConfig

logger = logging.getLogger(__name__)


@dataclass
class ProbeResult:
    verdict: str
    checks: list[CheckResult]
    facts: dict
    recommendations: dict
    differences: list[tuple[str, str, str]] = field(default_factory=list)
    dry_run: dict | None = None  # components/probe/dry_run.DryRun.to_dict() when one ran

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "checks": [c.to_dict() for c in self.checks],
                "recommendations": self.recommendations, "dry_run": self.dry_run,
                "baseline_differences": [{"fact": f, "baseline": a, "here": b} for f, a, b in self.differences],
                "facts": self.facts}


def recommend(facts: dict, expect: Expectations) -> dict:
    """What the train and tune steps take from the probe: a starting batch, the precision,
    how many parallel calls the input pipeline should use, and how many GPUs there are (the
    tune step's `auto` budget and trials at once) and the training rate measured here (a time
    budget's epochs)."""
    gpus = facts["tensorflow"]["gpus"]
    precision, _ = precision_for([g["compute_capability"][0] for g in gpus if g.get("compute_capability")])
    _, safe_batch = check_gpu_memory(facts, expect)
    return {"largest_safe_batch": safe_batch, "mixed_precision": precision, "model_shape": expect.shape,
            "input_parallelism": max(1, int(facts["cpu"]["usable"])), "gpus": len(gpus),
            "images_per_second": measured_rate(expect)}


def measured_rate(expect: Expectations) -> float | None:
    """Images/s training will reach here, as measured (the slower of the model's steps and the
    input pipeline), for a time budget's epochs; None when the probe measured neither."""
    rates = [rate for rate, source in ((expect.images_per_second, expect.rate_source),
                                       (expect.input_images_per_second, expect.input_source))
             if rate and source.startswith("measured")]
    return round(min(rates), 2) if rates else None


def dry_run_check(config: TrainConfig, recommendations: dict) -> tuple[CheckResult, dict]:
    """The dry run of the real training (components/probe/dry_run.py) as a check."""
    from components.probe.dry_run import dry_run

    logger.info("probe: dry run of the training (%s, --precision %s, --xla %s)", config.data_dir, config.precision,
                config.xla)
    result = dry_run(config, recommendations)
    if result.passed:
        return CheckResult("dry_run", PASS, f"the real training ran here in {result.seconds:g} s: {result.what}"), \
            result.to_dict()
    return CheckResult("dry_run", FAIL, f"the real training fails here after {result.seconds:g} s ({result.what}): "
                                        f"{result.error}", result.fix), result.to_dict()


def shards_check(data_dir: str) -> CheckResult:
    """The data check: each shard's sha256 against manifest.json (a build's shards), and every
    record decoded where the build did not (components/detector/shard_check.py)."""
    from components.detector.records import ShardsChanged
    from components.detector.shard_check import UnreadableShards, check_shards, decoded_at_build, has_manifest

    built = has_manifest(data_dir)
    try:
        check_shards(data_dir, verify_sha256=built)
    except (UnreadableShards, ShardsChanged) as err:
        return CheckResult("shards", FAIL, str(err), "copy the shards again from the build, or rebuild them with "
                                                     "`detpipe data build` (it rejects images TensorFlow cannot decode)")
    what = ("every shard's sha256 matches manifest.json" if built else "no manifest.json (another converter's shards)")
    how = ("its build decoded every image with TensorFlow" if decoded_at_build(data_dir)
           else "every image decoded here with TensorFlow")
    return CheckResult("shards", PASS, f"{what}; {how}")


# The training settings the memory check, the training rate and the input rate assume.
EXPECTED_SETTINGS = ("image_size", "model_size", "batch_size", "tile")


def probe_with_data(data_dir: str | None, settings: dict, dry_run: TrainConfig | None = None,
                    dry_run_off: str = "", **probe_args) -> ProbeResult:
    """`run_probe` with the shards checked first (`shards_check`): the expectations fitted to the
    data (`Expectations.from_train_options` of the training `settings`' EXPECTED_SETTINGS), its read
    speed and the dry run only on shards that passed; on shards that did not, the machine's checks
    and the failed one. `dry_run_off`: why a run that would have a dry run has none (a WARN says so)."""
    if dry_run_off:
        result = probe_with_data(data_dir, settings, None, **probe_args)
        checks = [*result.checks, CheckResult("dry_run", WARN, f"not run ({dry_run_off}): the train step's first "
                                                               "steps are the training's first run on this machine",
                                              "leave the dry run on (the default)")]
        return replace(result, checks=checks, verdict=verdict(checks))
    shards = shards_check(data_dir) if data_dir else None
    if shards is not None and shards.status == FAIL:
        logger.warning("probe: %s; the checks that read the shards are skipped", shards.reason)
        data_dir, dry_run = None, None
    expect = Expectations.from_train_options(**{name: settings[name] for name in EXPECTED_SETTINGS},
                                             data_dir=data_dir)
    result = run_probe(data_dir=data_dir, expect=expect, dry_run=dry_run, **probe_args)
    if shards is None:
        return result
    checks = [*result.checks, shards]
    return replace(result, checks=checks, verdict=verdict(checks))


def run_probe(require_gpu: bool = False, data_dir: str | None = None, output_dir: str = ".",
              expect: Expectations = Expectations(), facts: dict | None = None,
              baseline: dict | None = None, dry_run: TrainConfig | None = None) -> ProbeResult:
    """Collect (or take) the facts, check them, recommend; with `dry_run` (the run's train
    config, on its data) also run a few steps of the real training here (dry_run_check)."""
    facts = collect(data_dir=data_dir, output_dir=output_dir) if facts is None else facts
    storage = facts.get("storage", {})
    batch = expect.batch_size or (16 if facts["tensorflow"]["gpus"] else 4)
    if storage.get("measured") and not expect.images_per_second:
        # The storage check compares with the rate this model trains at here, measured.
        from components.detector.training_rate import measure_training_rate

        rate = measure_training_rate(expect.model(), batch, expect.boxes_per_image)
        expect = replace(expect, images_per_second=rate.images_per_second, rate_source=rate.source)
    shards = data_dir or storage.get("data_dir")
    if storage.get("measured") and shards and not expect.input_images_per_second:
        # Whether this host's CPUs keep up with that rate: the real input pipeline on the real shards.
        from components.train.input_pipeline import measure_input_rate

        try:
            model = expect.model()
            made = measure_input_rate(shards, model.image_size, batch, tiled=model.tiled,
                                      settled_above=expect.images_per_second)
            expect = replace(expect, input_images_per_second=made.images_per_second, input_source=made.source)
        except FileNotFoundError:  # no train split to time (storage timed what there is)
            pass
    checks = run_checks(facts, require_gpu=require_gpu, expect=expect)
    differences = compare_facts(baseline.get("facts", baseline), facts) if baseline else []
    recommendations = recommend(facts, expect)
    ran = None
    if dry_run is not None:
        check, ran = dry_run_check(dry_run, recommendations)
        checks.append(check)
    return ProbeResult(verdict(checks), checks, facts, recommendations, differences, ran)


def probe_markdown(result: ProbeResult) -> str:
    facts = result.facts
    tf_facts = facts["tensorflow"]
    build = tf_facts["build"]
    nvml = facts.get("nvml", {})
    rec = result.recommendations
    lines = [
        f"# Environment probe: {result.verdict}", "",
        "| check | status | reason | fix |", "|---|---|---|---|",
        # A reason and the model shape can quote the data (a class name): as text (data_text.py)
        *[f"| {c.name} | {c.status} | {markdown_text(c.reason)} | {c.fix} |" for c in result.checks],
        "", "## For training", "",
        f"- largest safe batch: {rec['largest_safe_batch'] if rec['largest_safe_batch'] is not None else 'n/a (no GPU)'}",
        f"- model shape the estimate assumes: {markdown_text(rec.get('model_shape') or 'n/a')}",
        f"- precision: {rec['mixed_precision']}",
        f"- input pipeline parallelism: {rec['input_parallelism']}",
        "", "## Machine", "", "| fact | value |", "|---|---|",
        f"| TensorFlow | {tf_facts['version']} (CUDA build: {build.get('is_cuda_build', False)}, "
        f"CUDA {build.get('cuda_version', '-')}, cuDNN {build.get('cudnn_version', '-')}, "
        f"kernels {', '.join(build.get('cuda_compute_capabilities') or []) or '-'}) |",
        f"| NVIDIA driver | {nvml.get('driver_version', '-')} (CUDA {nvml.get('driver_cuda_version', '-')}) |",
        f"| GPUs | {len(tf_facts['gpus'])}: {', '.join(g['name'] for g in tf_facts['gpus']) or '-'} |",
        f"| CPUs usable / visible | {facts['cpu']['usable']} / {facts['cpu']['visible']} ({facts['cpu'].get('model', '')}) |",
        f"| RAM total / available | {_gib(facts['memory'].get('total'))} / {_gib(facts['memory'].get('available'))} |",
        f"| Python | {facts['python']} |",
    ]
    if result.differences:
        lines += ["", "## Differences from the baseline", "", "| fact | baseline | here |", "|---|---|---|",
                  *[f"| {f} | {a} | {b} |" for f, a, b in result.differences]]
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


def load_baseline(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a probe.json (not JSON: {err})") from None
    if not isinstance(data, dict) or "facts" not in data:
        raise ValueError(f"{path} is not a probe.json (no 'facts')")
    return data


__all__ = ["ProbeResult", "run_probe", "probe_markdown", "write_probe", "load_baseline", "difference_lines"]
