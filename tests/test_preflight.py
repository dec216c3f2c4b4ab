"""Mistakes a newcomer makes on day one are answered at once, before TensorFlow or Beam load:
each command's paths are checked for what they hold (images, annotations, shards, a trained
or an exported model) and the message says what was found instead."""

import json
import subprocess
import sys

import pytest

from pipeline import preflight


def _in_fresh_python(commands: list[list[str]]) -> list[tuple[int, str, list[str]]]:
    """Each `detpipe ARGS` in one new interpreter: its exit code, its stderr, and which heavy
    modules had been loaded by the time it answered (none may be, for any of them)."""
    code = ("import contextlib, io, json, sys\nfrom pipeline.cli import main\nout = []\n"
            "for args in json.loads(sys.argv[1]):\n"
            "    err = io.StringIO()\n"
            "    with contextlib.redirect_stderr(err):\n"
            "        try:\n            rc = main(args)\n        except SystemExit as e:\n            rc = e.code\n"
            "    heavy = [m for m in ('tensorflow', 'apache_beam', 'keras', 'kfp', 'tensorflow_data_validation') "
            "if m in sys.modules]\n"
            "    out.append([rc, err.getvalue(), heavy])\n"
            "print(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], capture_output=True, text=True,
                          timeout=120)
    return [tuple(row) for row in json.loads(done.stdout.strip().splitlines()[-1])]


@pytest.fixture(scope="module")
def folders(demo_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("mistakes")
    (root / "notes").mkdir()
    (root / "notes" / "readme.txt").write_text("hello")
    (root / "saved").mkdir()
    (root / "saved" / "saved_model.pb").write_bytes(b"")
    (root / "trained" / "saved_model").mkdir(parents=True)  # what `detpipe train` writes
    (root / "trained" / "saved_model" / "saved_model.pb").write_bytes(b"")
    (root / "trained" / "model.keras").write_bytes(b"")
    return root


def _mistakes(demo, root):
    images, annotations, out = str(demo / "images"), str(demo / "annotations"), str(root / "out")
    return [
        (["data", "build", "--format", "voc", "--images", images, "--annotations", images, "--output", out],
         ["--annotations", "holds no *.xml files", ".jpg files", "swapped"]),
        (["data", "build", "--format", "voc", "--images", annotations, "--annotations", annotations, "--output", out],
         ["--images", "holds no image files", ".xml files", "swapped"]),
        (["data", "build", "--format", "coco", "--images", images, "--annotations", annotations, "--output", out],
         ["is a folder; --format coco reads one .json file", "--format voc"]),
        (["data", "build", "--format", "voc", "--images", images, "--annotations", str(demo / "coco.json"),
          "--output", out], ["--format voc reads a folder", "--format coco"]),
        (["run", "--local", "--images", images, "--annotations", str(demo / "labels.csv")], ["--format csv"]),
        (["train", "--data", str(demo), "--output", out],
         ["--data", "not the output of `detpipe data build`", "raw dataset"]),
        (["tune", "--data", str(root / "notes"), "--output", out], ["no train-*.tfrecord shards", ".txt files"]),
        (["probe", "--data", images], ["not the output of `detpipe data build`"]),
        (["evaluate", "--model", str(root / "saved"), "--data", str(demo), "--output", out],
         ["--model", "not the output of `detpipe train`", "exported SavedModel"]),
        (["export", "--model", str(root / "notes"), "--output", out], ["not the output of `detpipe train`"]),
        (["predict", "--model", str(root / "notes"), str(demo / "images" / "x.jpg")],
         ["not an exported model", "saved_model.pb"]),
    ]


def test_each_mistake_is_one_line_before_any_heavy_import(demo_dir, folders):
    mistakes = _mistakes(demo_dir, folders)
    for (args, words), (rc, err, heavy) in zip(mistakes, _in_fresh_python([args for args, _ in mistakes])):
        assert rc == 2, (args, err)
        lines = [line for line in err.splitlines() if "error" in line]
        assert len(lines) == 1 and all(w in lines[0] for w in words), (args, err)
        assert heavy == [], (args, heavy)


def test_what_is_right_passes(demo_dir, folders):
    assert preflight.images_problem(str(demo_dir / "images")) is None
    assert preflight.images_problem(str(demo_dir)) is None  # subfolders: a COCO file may name images in them
    assert preflight.annotations_problem(str(demo_dir / "annotations"), "voc") is None
    assert preflight.annotations_problem(str(demo_dir / "coco.json"), "coco") is None
    assert preflight.annotations_problem(str(demo_dir / "labels.csv"), "csv") is None
    assert preflight.saved_model_problem(str(folders / "saved")) is None
    assert f"did you mean {folders / 'trained' / 'saved_model'}?" in preflight.saved_model_problem(
        str(folders / "trained"))
    for check in (preflight.shards_problem, preflight.trained_model_problem, preflight.saved_model_problem):
        assert check("gs://bucket/somewhere") is None  # checked by what reads it


def test_built_shards_and_a_training_output_pass(demo_shards, tmp_path):
    from components.detector.artifacts import CONFIG_FILE, MODEL_FILE

    assert preflight.shards_problem(str(demo_shards)) is None  # what `data build` wrote in this session
    trained = tmp_path / "trained"  # the names `detpipe train` writes (its artifacts' one definition)
    trained.mkdir()
    for name in (MODEL_FILE, CONFIG_FILE, "training_curves.png"):
        (trained / name).write_bytes(b"")
    assert preflight.trained_model_problem(str(trained)) is None
    assert "trained model" in preflight.shards_problem(str(trained))
