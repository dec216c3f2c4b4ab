"""mixed_bfloat16 (A100, L4, H100: compute capability 8.x and newer) under XLA,
forced on this CPU, through every GPU-only path on real photos: checkpoints, a NaN
recovery, the weight average, evaluation, export and serve
(tests/policy_runs.py)."""

from policy_runs import policy_module

policy_run, test_mixed_bfloat16_trains_recovers_exports_and_serves_under_xla = policy_module("mixed_bfloat16")
