"""Compile the DAG to one YAML, byte-identical for the same code and options."""

import hashlib
from pathlib import Path

from kfp import compiler

from pipeline.dag import DEFAULT_IMAGE, StepResources, make_pipeline


def compile_pipeline(output: Path, image: str = DEFAULT_IMAGE, resources: StepResources = StepResources()) -> str:
    """Write the pipeline YAML to `output` and return its sha256."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(make_pipeline(image, resources), str(output))
    return hashlib.sha256(output.read_bytes()).hexdigest()
