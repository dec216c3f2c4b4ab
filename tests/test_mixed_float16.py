"""mixed_float16 (the default accelerator's, a T4's: compute capability 7.x) under XLA,
forced on this CPU, through every GPU-only path on real photos: a checkpoint, a SIGTERM and
a resume, a NaN recovery with the loss scale, the weight average, evaluation, export and serve
(tests/policy_runs.py)."""

import pytest

from policy_runs import assert_the_policy_ran_every_path, run_policy


@pytest.fixture(scope="module")
def policy_run(raccoon_shards, tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return run_policy(raccoon_shards, tmp_path_factory.mktemp("mixed_float16"), "mixed_float16", monkeypatch)


@pytest.mark.slow
def test_mixed_float16_with_xla_trains_resumes_recovers_exports_and_serves(policy_run):
    assert_the_policy_ran_every_path(policy_run, "mixed_float16")
