"""Compile the DAG to one YAML, byte-identical for the same code and options."""

import hashlib
from pathlib import Path

from kfp import compiler

from pipeline.dag import DEFAULT_IMAGE, StepResources, make_pipeline


PIPELINES = ("detpipe", "batch-predict")


def compile_pipeline(output: Path, image: str = DEFAULT_IMAGE, resources: StepResources = StepResources(),
                     pipeline: str = "detpipe") -> str:
    """Write the YAML of `pipeline` (the training DAG, or batch-predict: pipeline/batch_dag.py)
    to `output` and return its sha256."""
    from pipeline.batch_dag import make_batch_pipeline

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {', '.join(PIPELINES)}, got {pipeline!r}")
    function = make_pipeline(image, resources) if pipeline == "detpipe" else make_batch_pipeline(image, resources.cloud)
    compiler.Compiler().compile(function, str(output))
    return hashlib.sha256(output.read_bytes()).hexdigest()
