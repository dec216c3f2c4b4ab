"""mixed_bfloat16 (A100, L4, H100: compute capability 8.x and newer) under XLA,
forced on this CPU, through every GPU-only path on real photos: a checkpoint, a SIGTERM and
a resume, a NaN recovery, the weight average, evaluation, export and serve
(tests/policy_runs.py)."""

import pytest

from policy_runs import assert_the_policy_ran_every_path, run_policy


@pytest.fixture(scope="module")
def policy_run(raccoon_shards, tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return run_policy(raccoon_shards, tmp_path_factory.mktemp("mixed_bfloat16"), "mixed_bfloat16", monkeypatch)


@pytest.mark.slow
def test_mixed_bfloat16_with_xla_trains_resumes_recovers_exports_and_serves(policy_run):
    assert_the_policy_ran_every_path(policy_run, "mixed_bfloat16")
