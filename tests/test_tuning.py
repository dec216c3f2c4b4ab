"""`detpipe tune` and `detpipe train --hparams`."""

import json
import math

import pytest

from components.train.tuning import DEFAULTS, SEARCH_SPACE, Trial, load_hparams, successive_halving


def test_successive_halving_keeps_the_best_third_and_trains_them_longer():
    candidates = [{"base_lr_per_64": lr, "weight_decay": 1e-4, "augment_strength": 0.5}
                  for lr in (0.001, 0.004, 0.002, 0.008, 0.003, 0.005)]
    seen = []

    def run_trial(trial: Trial) -> float:
        seen.append((trial.hparams["base_lr_per_64"], trial.steps))
        if trial.hparams["base_lr_per_64"] == 0.004:
            raise RuntimeError("diverged")  # a failed trial ranks last, the search goes on
        # Short trials favour high rates; long ones favour 0.005.
        lr = trial.hparams["base_lr_per_64"]
        return lr if trial.steps == 10 else -abs(lr - 0.005)

    result = successive_halving(candidates, run_trial, trial_steps=10)
    assert [s for _, s in seen] == [10] * 6 + [30] * 2
    assert {lr for lr, s in seen if s == 30} == {0.008, 0.005}
    assert result.best["base_lr_per_64"] == 0.005
    failed = [t for t in result.trials if t.error]
    assert len(failed) == 1 and "diverged" in failed[0].error and failed[0].score is None


def test_hparams_files_are_checked_one_line_per_problem(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"base_lr_per_64": 0.01, "augment_strength": 0.2, "score": {"value": 0.3}}))
    assert load_hparams(str(good)) == {"base_lr_per_64": 0.01, "augment_strength": 0.2}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"learning_rate": 0.1, "weight_decay": "big", "augment_strength": 3}))
    with pytest.raises(ValueError) as err:
        load_hparams(str(bad))
    lines = str(err.value).splitlines()
    assert len(lines) == 3
    assert "unknown hyperparameter 'learning_rate'" in lines[0] and "weight_decay must be" in lines[1]
    assert "augment_strength must be at most 1" in lines[2]
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        load_hparams(str(tmp_path / "broken.json"))


@pytest.mark.slow
def test_tune_runs_real_trials_and_train_takes_the_result(demo_shards, tmp_path):
    from components.train.tuning import tune, TuneConfig
    from pipeline.cli import main

    out = tmp_path / "tune"
    result = tune(TuneConfig(data_dir=str(demo_shards), output_dir=str(out), trials=2, trial_steps=2,
                             train={"batch_size": 4, "image_size": 64}))
    assert len(result.trials) == 3 and result.trials[2].steps == 6  # 2 short trials, the best again 3x longer
    assert result.trials[0].hparams == DEFAULTS
    best = json.loads((out / "best_hparams.json").read_text())
    assert set(SEARCH_SPACE) <= set(best) and best["search"]["trials"] == 2
    assert math.isfinite(best["score"]["value"]) and best["score"]["value"] == result.best_score
    assert len((out / "trials.jsonl").read_text().splitlines()) == 3
    assert "| trial | steps |" in (out / "tune_report.md").read_text()

    # The command line wins over the file; the file wins over the defaults.
    model = tmp_path / "model"
    assert main(["train", "--data", str(demo_shards), "--output", str(model), "--batch-size", "4",
                 "--image-size", "64", "--max-steps", "2", "--hparams", str(out / "best_hparams.json"),
                 "--weight-decay", "0.0005"]) == 0
    train = json.loads((model / "train_config.json").read_text())["train"]
    assert train["base_lr_per_64"] == best["base_lr_per_64"]
    assert train["augment_strength"] == best["augment_strength"]
    assert train["weight_decay"] == 0.0005


def test_train_with_a_bad_hparams_file_fails_with_one_line_per_problem(tmp_path, capsys):
    from pipeline.cli import main

    bad = tmp_path / "h.json"
    bad.write_text(json.dumps({"lr": 1, "weight_decay": -1}))
    (tmp_path / "label_map.json").write_text("{}")  # a folder the command line takes for shards
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    assert main(["train", "--data", str(tmp_path), "--output", str(tmp_path / "m"), "--hparams", str(bad)]) != 0
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if line.startswith("detpipe: ")]) == 2
