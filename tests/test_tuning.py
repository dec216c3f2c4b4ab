"""`detpipe tune` (components/tune) and `detpipe train --hparams`."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
from cli_here import run_here

from components.tune.budget import AUTO_TRIALS, MIN_HOLDOUT_IMAGES, choose_search
from components.tune.hparams_file import DEFAULTS, SEARCH_SPACE, BestHparams, load_hparams

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
# A search small enough for the suite: 2 trials of 3 epochs of the demo shards' fit part at batch 4, 64 px.
SMALL = ["--trials", "2", "--epochs", "2", "--batch-size", "4", "--image-size", "64", "--deterministic", "--seed", "3"]


def test_auto_searches_only_where_it_can_pay_and_says_why():
    on_gpu = choose_search("auto", gpus=1, num_train=2000, epochs=10)
    assert on_gpu.trials == AUTO_TRIALS and 0 < on_gpu.cost <= 3.0 and on_gpu.reason.startswith("auto on 1 GPU(s)")
    on_cpu = choose_search("auto", gpus=0, num_train=2000, epochs=10)
    assert on_cpu.trials == 0 and "without a GPU" in on_cpu.reason and "tune_trials N" in on_cpu.reason
    assert on_cpu.short == "auto: no GPU"  # the console line
    few = choose_search("auto", gpus=4, num_train=MIN_HOLDOUT_IMAGES * 2, epochs=10)  # 20% held out: too few
    assert few.trials == 0 and f"fewer than {MIN_HOLDOUT_IMAGES}" in few.reason
    given = choose_search("5", gpus=0, num_train=100, epochs=10, trial_epochs=2)
    assert (given.trials, given.trial_epochs, given.reason.split(":")[0]) == (5, 2, "given")
    assert choose_search(0, gpus=8, num_train=10**6, epochs=10).trials == 0
    with pytest.raises(ValueError, match="'auto' or a whole number"):
        choose_search("many", gpus=1, num_train=10, epochs=1)


def test_hparams_files_are_checked_one_line_per_problem(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"base_lr_per_64": 0.01, "augment_strength": 0.2, "score": {"value": 0.3},
                                "trials": 4, "decision": "given", "search": {}}))
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
    # The writer's file is what the reader takes.
    best = BestHparams(dict(DEFAULTS), 0.2, 0.1, "mAP", 3, "given", {"seconds": 1.0})
    best.write(str(tmp_path))
    assert load_hparams(str(tmp_path / "best_hparams.json")) == DEFAULTS
    assert BestHparams.from_dict(json.loads((tmp_path / "best_hparams.json").read_text())) == best


def test_the_tuning_split_holds_train_records_only_each_once(demo_shards, tmp_path):
    import tensorflow as tf

    from beam.contract import feature_keys as K
    from components.detector.records import count_records, shard_files
    from components.detector.holdout import carve_tuning_split, held_out

    split = carve_tuning_split(str(demo_shards), str(tmp_path / "split"), 0.25, seed=1)

    def keys(folder, name):
        return sorted(tf.train.Example.FromString(r).features.feature[K.KEY_SHA256].bytes_list.value[0].decode()
                      for r in tf.data.TFRecordDataset(shard_files(folder, name)).as_numpy_iterator())

    train, val = keys(str(demo_shards), "train"), keys(str(demo_shards), "val")
    fit, held = keys(split.folder, "train"), keys(split.folder, "val")
    assert sorted(fit + held) == train and not set(held) & set(val)  # every train record once, no val record
    assert held == sorted(k for k in train if held_out(k, 0.25, 1)) and 0 < len(held) < len(train)
    assert (split.fit, split.held_out) == (len(fit), len(held)) == (count_records(split.folder, "train"),
                                                                     count_records(split.folder, "val"))
    again = carve_tuning_split(str(demo_shards), str(tmp_path / "split"), 0.25, seed=1)  # a resumed step: taken
    assert again == split
    with pytest.raises(ValueError, match="leaves .* to train trials on and 0 to score them"):
        carve_tuning_split(str(demo_shards), str(tmp_path / "none"), 1e-9, seed=1)
    # A search asked for where nothing can be held out: the given values, and the reason, not a failed run.
    from components.tune.search import TuneConfig, tune

    result = tune(TuneConfig(str(demo_shards), str(tmp_path / "tune"), trials=2, train={"holdout": 1e-9, "epochs": 3}))
    assert result.best.trials == 0 and result.best.hparams == DEFAULTS
    assert result.best.decision.startswith("no search: the train split of") and "0 to score them" in \
        (tmp_path / "tune" / "tune_report.md").read_text()


@pytest.mark.slow
def test_a_preempted_search_resumes_without_val_and_chooses_as_an_uninterrupted_one(demo_shards, tmp_path,
                                                                                     monkeypatch):
    """SIGTERM in trial 0 (`term@15`, fault injection: a real SIGTERM to this process as step 15
    starts): the trial checkpoints and `tune` exits 143 with nothing recorded as failed. Then
    the val shards are made unreadable and the same command goes on: it continues trial 0 from
    its checkpoint (no finished rung trained again) and ends with the choice, and the scores, of
    an uninterrupted search with val readable (--deterministic). The three searches run in this
    process, as the CLI's `main` runs them: what a new process would add is its TensorFlow import."""
    from pipeline.cli import main

    def tune(data, out) -> tuple[int, str]:
        return run_here(["tune", "--data", str(data), "--output", str(out), *SMALL])

    data = tmp_path / "data"
    shutil.copytree(demo_shards, data)
    monkeypatch.setenv("DETPIPE_INJECT_FAULT", "term@15")
    code, said = tune(data, tmp_path / "tune")
    monkeypatch.delenv("DETPIPE_INJECT_FAULT")
    assert code == 143, said[-3000:]
    assert "SIGTERM: stopped at step 15" in said and not (tmp_path / "tune" / "best_hparams.json").exists()
    first_rung = re.search(r"trial 0 at step (\d+):", said).group(1)  # scored before the stop

    for shard in data.glob("val-*.tfrecord"):
        shard.write_bytes(b"\0" * shard.stat().st_size)  # same size, so only reading it would fail
    code, said = tune(data, tmp_path / "tune")
    assert code == 0, said[-3000:]
    assert "continuing 1 trial(s) a stopped run left running" in said
    assert "resumed after step 15" in said and f"trial 0 at step {first_rung}:" not in said

    assert main(["tune", "--data", str(demo_shards), "--output", str(tmp_path / "whole"), *SMALL]) == 0

    def rows(folder):
        return [json.loads(line) for line in (folder / "trials.jsonl").read_text().splitlines()]

    first, whole = rows(tmp_path / "tune"), rows(tmp_path / "whole")
    assert [t["number"] for t in first] == [0, 1] and all(t["error"] is None for t in first)
    assert first[0]["hparams"] == DEFAULTS and first[0]["state"] == "COMPLETE"
    assert [(t["hparams"], t["rungs"], t["state"]) for t in first] == [(t["hparams"], t["rungs"], t["state"])
                                                                        for t in whole]
    best = json.loads((tmp_path / "tune" / "best_hparams.json").read_text())
    assert best == {**json.loads((tmp_path / "whole" / "best_hparams.json").read_text()),
                    "search": best["search"]}  # the same choice and scores; the costs differ
    assert best["score"]["metric"] == "mAP@[.5:.95] on the tuning split" and math.isfinite(best["score"]["value"])
    report = (tmp_path / "tune" / "tune_report.md").read_text()
    assert "The val split was never read" in report and "| 0 | complete |" in report
    assert not (tmp_path / "tune" / "trials" / "000").exists()  # a finished trial's checkpoints are removed
    from components.report.run_report import RunInputs, render_run_report

    page = render_run_report(RunInputs(tune_dir=str(tmp_path / "tune")))  # the run report reads what tune wrote
    assert '<h2 id="tuning">Hyperparameter search</h2>' in page and "the val split was never read" in page
    assert page.count('alt="Optimisation history"') == 1
    assert f"<td>trial {best['search']['best_trial']}</td>" in page

    # `train --hparams`: the command line wins over the file; the file over the defaults.
    model = tmp_path / "model"
    assert main(["train", "--data", str(demo_shards), "--output", str(model), "--batch-size", "4", "--epochs", "1",
                 "--image-size", "64", "--max-steps", "2", "--hparams", str(tmp_path / "tune" / "best_hparams.json"),
                 "--weight-decay", "0.0005", "--no-export"]) == 0
    train = json.loads((model / "train_config.json").read_text())["train"]
    assert train["base_lr_per_64"] == best["base_lr_per_64"]
    assert train["augment_strength"] == best["augment_strength"]
    assert train["weight_decay"] == 0.0005


@pytest.mark.slow
def test_a_trial_is_trained_in_one_go_scored_at_its_rungs_and_stops_where_it_is_pruned(demo_shards, tmp_path):
    """`train_rungs` scores each rung as training passes it; pruned at the first rung, the
    trial stops there: a checkpoint at that step and no finished model."""
    from components.train.config import TrainConfig
    from components.detector.holdout import carve_tuning_split
    from components.tune.trials import train_rungs, trial_regime

    split = carve_tuning_split(str(demo_shards), str(tmp_path / "split"), 0.25, seed=0)
    regime = trial_regime(TrainConfig(str(demo_shards), "", epochs=3, batch_size=4, image_size=64), split, 3)
    assert len(regime.stops) == 2
    asked = []
    score = train_rungs(regime, str(tmp_path / "model"), DEFAULTS, {},
                        lambda step, value: asked.append((step, value)) or True)
    assert [step for step, _ in asked] == [regime.stops[0]] and score == asked[0][1] and math.isfinite(score)
    state = (tmp_path / "model" / "checkpoints" / "checkpoint").read_text()
    assert f'model_checkpoint_path: "ckpt-{regime.stops[0]}"' in state
    assert not (tmp_path / "model" / "model.keras").exists()


def test_train_with_a_bad_hparams_file_fails_with_one_line_per_problem(tmp_path, capsys):
    from pipeline.cli import main

    bad = tmp_path / "h.json"
    bad.write_text(json.dumps({"lr": 1, "weight_decay": -1}))
    (tmp_path / "label_map.json").write_text("{}")  # a folder the command line takes for shards
    (tmp_path / "train-00000-of-00001.tfrecord").write_bytes(b"")
    assert main(["train", "--data", str(tmp_path), "--output", str(tmp_path / "m"), "--hparams", str(bad)]) != 0
    err = capsys.readouterr().err.splitlines()
    assert len([line for line in err if line.startswith("detpipe: ")]) == 2


def test_the_examples_in_the_tune_modules_run():
    import doctest

    from components.detector import holdout
    from components.tune import budget, hparams_file, vertex_job

    for module in (budget, hparams_file, holdout, vertex_job):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_a_continued_study_never_proposes_a_finished_trials_values(tmp_path):
    """The sampler is seeded by the seed, the worker's stream and the trials so far (search._ask):
    the same search proposes the same values whether or not it was stopped, and a study opened
    again (a new process after a SIGKILL) proposes new values, not those of the trials it ran."""
    from components.train.config import TrainConfig
    from components.tune.study import _ask, open_study
    from components.tune.trials import TrialRegime

    regime = TrialRegime(TrainConfig("split", ""), (3, 9), 20, "")

    def search(folder, stop_after=None):
        folder.mkdir()
        study, proposed = open_study(str(folder), regime, DEFAULTS), []
        for number in range(6):
            if number == stop_after:  # the process ends; another opens the journal
                study = open_study(str(folder), regime, DEFAULTS)
            trial = study.ask() if number == 0 else _ask(study, stream=3000)  # the enqueued defaults first
            values = {n: trial.suggest_float(n, lo, hi, log=log) for n, (lo, hi, log) in SEARCH_SPACE.items()}
            proposed.append(values)
            study.tell(trial, sum(values.values()))  # a score per trial; the sampler's only input
        return proposed

    whole, stopped = search(tmp_path / "a"), search(tmp_path / "b", stop_after=3)
    assert whole == stopped and whole[0] == DEFAULTS
    assert len({tuple(v.values()) for v in whole}) == 6  # no values proposed twice


def test_without_a_search_the_step_writes_the_given_values_and_imports_no_tensorflow(tmp_path):
    """Every pipeline run on a CPU passes through the tune step: without a search it costs no
    TensorFlow import (seconds in every run)."""
    script = ("import sys, json\nfrom components.train.config import ProbeAdvice\n"
              "from components.tune.search import TuneConfig, tune\n"
              f"r = tune(TuneConfig(data_dir={str(tmp_path)!r}, output_dir={str(tmp_path / 'out')!r}, "
              "train={'epochs': 3, 'probe': ProbeAdvice(gpus=0)}, start={'weight_decay': 0.0003}))\n"
              "print(json.dumps(['tensorflow' in sys.modules, r.best.trials, r.budget.short]))")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=ENV, capture_output=True, text=True, check=True)
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [False, 0, "auto: no GPU"]
    assert load_hparams(str(tmp_path / "out" / "best_hparams.json")) == {**DEFAULTS, "weight_decay": 0.0003}
