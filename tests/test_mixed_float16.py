"""mixed_float16 (the default accelerator's, a T4's: compute capability 7.x) under XLA,
forced on this CPU, through every GPU-only path on real photos: a checkpoint, a SIGTERM and
a resume, a NaN recovery with the loss scale, the weight average, evaluation, export and serve
(tests/policy_runs.py)."""

from policy_runs import policy_module

policy_run, test_mixed_float16_trains_resumes_recovers_exports_and_serves_under_xla = policy_module("mixed_float16")
