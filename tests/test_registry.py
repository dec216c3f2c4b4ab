"""The model registry: source fingerprints, versions, the champion, `detpipe registry`."""

import json
import os

import pytest

from components.evaluate.metrics_file import METRICS_FILE, EvalMetrics, Gate
from components.evaluate.threshold import ThresholdChoice
from components.model_registry.decision import DecisionRecord, Verdict
from components.fingerprint.fingerprint import fingerprint_source
from components.register.register import register_run
from components.model_registry.registry import Registry, RegistryError
from components.model_registry.store import Conflict, GcsStore, LocalStore
from pipeline.cli import main
from tests.fake_gcs import FakeClient


# ------------------------------------------------------------ fingerprint

def _source(tmp_path):
    images, annotations = tmp_path / "images", tmp_path / "annotations"
    images.mkdir(), annotations.mkdir()
    for i in range(3):
        (images / f"{i}.jpg").write_bytes(b"jpeg" * (i + 1))
        (annotations / f"{i}.xml").write_text(f"<annotation>{i}</annotation>")
    return str(images), str(annotations)


def test_local_fingerprint_changes_exactly_when_the_source_does(tmp_path):
    images, annotations = _source(tmp_path)
    first = fingerprint_source(images, annotations)
    assert fingerprint_source(images, annotations) == first  # unchanged: same
    assert (first.images, first.annotations) == (3, 3)
    (tmp_path / "images" / ".DS_Store").write_bytes(b"finder")  # not data
    assert fingerprint_source(images, annotations).sha256 == first.sha256

    (tmp_path / "images" / "3.jpg").write_bytes(b"new photo")  # one image added
    added = fingerprint_source(images, annotations)
    assert added.sha256 != first.sha256 and added.images == 4

    xml = tmp_path / "annotations" / "0.xml"  # one annotation edited, same size, later mtime
    xml.write_text("<annotation>9</annotation>")
    os.utime(xml, ns=(xml.stat().st_atime_ns, xml.stat().st_mtime_ns + 10**9))
    edited = fingerprint_source(images, annotations)
    assert edited.sha256 != added.sha256

    split = tmp_path / "split.json"  # a split file is data too
    split.write_text('{"train": ["0"], "val": ["1"]}')
    with_split = fingerprint_source(images, annotations, split_file=str(split))
    assert with_split.sha256 != edited.sha256 and fingerprint_source(images, annotations) == edited
    split.write_text('{"train": ["1"], "val": ["0"]}')
    os.utime(split, ns=(split.stat().st_atime_ns, split.stat().st_mtime_ns + 10**9))
    assert fingerprint_source(images, annotations, split_file=str(split)).sha256 != with_split.sha256

    val = tmp_path / "val"  # a dataset that comes split: the val split's annotations and images are data too
    val.mkdir()
    val_images, val_annotations = _source(val)
    given = fingerprint_source(images, annotations, val_annotations=val_annotations, val_images=val_images)
    assert given.sha256 != edited.sha256 and (given.images, given.annotations) == (4 + 3, 3 + 3)
    same_folder = fingerprint_source(images, annotations, val_annotations=val_annotations, val_images=images)
    assert same_folder.sha256 not in (given.sha256, edited.sha256) and same_folder.images == 4
    (val / "images" / "9.jpg").write_bytes(b"a new val photo")
    assert fingerprint_source(images, annotations, val_annotations=val_annotations,
                              val_images=val_images).sha256 != given.sha256


def test_fingerprint_of_a_single_annotations_file_and_a_missing_path(tmp_path):
    images, _ = _source(tmp_path)
    coco = tmp_path / "instances.json"
    coco.write_text("{}")
    assert fingerprint_source(images, str(coco)).annotations == 1
    with pytest.raises(FileNotFoundError, match="nope"):
        fingerprint_source(str(tmp_path / "nope"), str(coco))


def test_gcs_fingerprint_from_the_listing():
    client = FakeClient()
    bucket = client.bucket("data")
    for name in ("photos/a.jpg", "photos/b.jpg", "photos/sub/c.png", "photos-old/x.jpg", "coco.json"):
        bucket.blob(name).upload_from_string(b"bytes of " + name.encode())
    first = fingerprint_source("gs://data/photos", "gs://data/coco.json", client=client)
    assert (first.images, first.annotations) == (3, 1)  # photos-old/ is another folder
    assert ("data", "photos") in client.listings
    assert fingerprint_source("gs://data/photos/", "gs://data/coco.json", client=client) == first

    bucket.blob("photos/d.jpg").upload_from_string(b"new")  # one image added
    added = fingerprint_source("gs://data/photos", "gs://data/coco.json", client=client)
    assert added.sha256 != first.sha256
    bucket.blob("coco.json").upload_from_string(b"bytes of coco.json")  # rewritten: new generation
    assert fingerprint_source("gs://data/photos", "gs://data/coco.json", client=client).sha256 != added.sha256
    with pytest.raises(FileNotFoundError, match="gs://data/none"):
        fingerprint_source("gs://data/none", "gs://data/coco.json", client=client)


# ------------------------------------------------------------ stores

@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path):
    return LocalStore(str(tmp_path / "reg")) if request.param == "local" else GcsStore("gs://b/reg", FakeClient())


def test_store_create_is_exclusive_and_replace_checks_what_was_read(store, tmp_path):
    store.create("m/versions/v1/claim.json", "mine")
    with pytest.raises(Conflict):
        store.create("m/versions/v1/claim.json", "theirs")
    assert store.read_text("m/versions/v1/claim.json") == "mine"
    assert store.read_text("m/none.json") is None
    store.replace("m/champion.json", "v1", expected=None)
    with pytest.raises(Conflict):
        store.replace("m/champion.json", "v2", expected=None)  # someone wrote it since
    store.replace("m/champion.json", "v2", expected="v1")
    assert store.read_text("m/champion.json") == "v2"
    assert store.list_dirs("m/versions") == ["v1"]
    folder = tmp_path / "model"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"\x00pb")
    (folder / "variables" / "v.index").write_bytes(b"idx")
    store.upload_dir(str(folder), "m/versions/v1/saved_model")
    store.download_dir("m/versions/v1/saved_model", str(tmp_path / "back"))
    assert (tmp_path / "back" / "variables" / "v.index").read_bytes() == b"idx"
    assert store.download_file("m/versions/v1/saved_model/saved_model.pb", str(tmp_path / "pb"))
    assert not store.download_file("m/versions/v1/none", str(tmp_path / "none"))


# ------------------------------------------------------------ registry and register step

def _run_files(tmp_path, name="run"):
    folder = tmp_path / name
    (folder / "saved_model").mkdir(parents=True)
    (folder / "saved_model" / "saved_model.pb").write_bytes(b"pb")
    (folder / "data").mkdir()
    for file in ("label_map.json", "schema.pbtxt", "stats-train.pb"):
        (folder / "data" / file).write_text("{}" if file.endswith(".json") else "x")
    EvalMetrics({"mAP": 0.3, "AP50": 0.6, "AP75": 0.2}, 10, Gate(0.0, True), ThresholdChoice(0.5, 0.6, 0.7, 0.5),
                1.0).write(folder / METRICS_FILE)
    return folder


def _decision(blessed: bool, champion: str | None, reason: str = "because") -> DecisionRecord:
    return DecisionRecord(rule={"promote_if": "not_worse"}, val={"images": 10, "fingerprint": "f" * 64},
                          challenger={"mAP": 0.3}, champion={"version": champion} if champion else None,
                          **Verdict(blessed, reason).as_fields())


@pytest.mark.parametrize("kind", ["local", "gcs"])
def test_register_moves_the_champion_only_when_blessed(tmp_path, kind):
    registry = (Registry.open(str(tmp_path / "reg")) if kind == "local"
                else Registry.open("gs://b/reg", client=FakeClient()))
    files = _run_files(tmp_path)
    register = lambda decision, run: register_run(  # noqa: E731
        registry, str(files / "saved_model"), str(files / "data"), str(files / "metrics.json"), decision,
        {"sha256": "a" * 64}, run)
    first = register(_decision(True, None, "no champion yet"), "run-1")
    assert (first.version, first.status, first.champion) == ("v1", "blessed", "v1")
    assert registry.champion_version() == "v1"

    (files / "saved_model" / "saved_model.pb").write_bytes(b"a worse model")
    second = register(_decision(False, "v1", "worse than the champion"), "run-2")
    assert (second.version, second.status, second.champion) == ("v2", "rejected", "v1")
    assert registry.champion_version() == "v1"  # unchanged
    v2 = registry.version("v2")
    assert v2["status"] == "rejected" and v2["reason"] == "worse than the champion" and v2["run_id"] == "run-2"
    assert v2["fingerprint"]["sha256"] == "a" * 64 and v2["metrics"]["mAP"] == 0.3
    assert json.loads(registry.read_file("v2", "decision.json"))["version"] == "v2"
    assert registry.read_file("v2", "schema.pbtxt") == "x"

    # A run compared with v1 while someone promoted v2 by hand is not promoted.
    registry.set_champion("v2", "pinned by hand", by="test", expected="v1")
    # The same model again (a cached scheduled run): nothing new is recorded.
    again = register(_decision(True, "v1"), "run-2b")  # v2's model, blessed this time: still not recorded
    assert (again.version, again.status, again.champion) == ("v2", "unchanged", "v2")
    assert registry.version_names() == ["v1", "v2"]

    (files / "saved_model" / "saved_model.pb").write_bytes(b"another model")
    third = register(_decision(True, "v1"), "run-3")
    assert third.status == "rejected" and "moved from v1 to v2" in third.reason
    assert registry.champion_version() == "v2"
    champion = registry.champion()
    assert [h["version"] for h in champion["history"]] == ["v1"] and champion["reason"] == "pinned by hand"
    assert [v["version"] for v in registry.versions()] == ["v1", "v2", "v3"]


def test_claims_skip_numbers_another_run_took(tmp_path):
    registry = Registry.open(str(tmp_path))
    assert registry.claim_version("a") == "v1"
    registry.store.create("detpipe/versions/v2/claim.json", "{}")  # another run, not finished
    assert registry.claim_version("b") == "v3"
    assert registry.version("v2")["status"] == "incomplete"
    with pytest.raises(RegistryError, match="incomplete"):
        registry.set_champion("v2", "try", by="test", expected=None)
    with pytest.raises(RegistryError, match="no version v9"):
        registry.version("v9")
    with pytest.raises(RegistryError, match="model name"):
        Registry.open(str(tmp_path), "bad/name")


def test_registry_cli_list_show_promote(tmp_path, capsys):
    registry = Registry.open(str(tmp_path / "reg"))
    files = _run_files(tmp_path)
    for i, blessed in enumerate((True, False), start=1):
        (files / "saved_model" / "saved_model.pb").write_bytes(b"model %d" % i)
        register_run(registry, str(files / "saved_model"), str(files / "data"), str(files / "metrics.json"),
                     _decision(blessed, "v1" if i > 1 else None), {"sha256": f"{i}" * 64}, f"run-{i}")
    where = ["--registry", str(tmp_path / "reg")]
    assert main(["registry", "list", *where]) == 0
    out = capsys.readouterr().out
    assert "* v1" in out and "  v2        rejected" in out
    assert main(["registry", "promote", "v2", "--reason", "roll forward: v1 misses night photos", *where]) == 0
    assert "champion: v1 -> v2" in capsys.readouterr().out
    champion = json.loads((tmp_path / "reg" / "detpipe" / "champion.json").read_text())
    assert champion["version"] == "v2" and champion["reason"] == "roll forward: v1 misses night photos"
    assert champion["by"].startswith("detpipe registry promote")
    assert main(["registry", "show", "v2", *where]) == 0
    assert "is the champion" in capsys.readouterr().out
    assert main(["registry", "promote", "v7", "--reason", "x", *where]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no version v7" in err[0]
    with pytest.raises(SystemExit) as exit_info:
        main(["registry", "promote", "v1", *where])  # --reason is required
    assert exit_info.value.code == 2


def test_a_champion_expected_but_gone_is_a_conflict_not_a_crash(tmp_path):
    registry = Registry.open(str(tmp_path))
    files = _run_files(tmp_path)
    register_run(registry, str(files / "saved_model"), str(files / "data"), str(files / "metrics.json"),
                 _decision(False, None), {"sha256": "a" * 64}, "run-1")
    with pytest.raises(Conflict, match="from v9 to none"):
        registry.set_champion("v1", "pin", by="test", expected="v9")


@pytest.mark.slow
def test_a_registered_model_changed_by_one_byte_is_refused_by_serve_predict_and_the_warm_start(
        tmp_path, trained_model, raccoon, capsys):
    """Registration records the sha256 of every file of the version; a byte of the weights
    changed afterwards: `serve` (before binding), `predict` and the warm start refuse the
    version, each in one line naming the file."""
    from components.export.saved_model import export_trained
    from components.model_registry.checksums import CHECKSUM_FILE, ModelChanged
    from components.model_registry.warm_source import warm_source

    export_trained(str(trained_model), str(tmp_path / "export"))
    files = _run_files(tmp_path)
    registry = Registry.open(str(tmp_path / "reg"))
    register_run(registry, str(tmp_path / "export"), str(files / "data"), str(files / "metrics.json"),
                 _decision(True, None), {"sha256": "a" * 64}, "run-1", train_dir=str(trained_model))
    version = tmp_path / "reg" / "detpipe" / "versions" / "v1"
    recorded = registry.version("v1")["sha256"]
    weights = next(p for p in (version / "saved_model" / "variables").iterdir() if p.name.startswith("variables.data"))
    assert f"saved_model/variables/{weights.name}" in recorded and "model.keras" in recorded
    assert json.loads((version / "saved_model" / CHECKSUM_FILE).read_text())[f"variables/{weights.name}"] == \
        recorded[f"saved_model/variables/{weights.name}"]
    assert warm_source("v1", registry, "v1", str(tmp_path / "w0")).folder  # untouched: it loads

    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    photo = str(raccoon / "images" / "raccoon-1.jpg")
    assert main(["serve", "--model", str(version / "saved_model"), "--port", "1"]) == 2
    assert main(["predict", "--model", str(version / "saved_model"), photo]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("detpipe")]
    assert len(lines) == 2 and all(f"{weights} changed since the registry recorded its sha256" in line
                                   for line in lines), lines

    keras_file = version / "model.keras"
    keras_file.write_bytes(keras_file.read_bytes() + b"\0")
    with pytest.raises(ModelChanged, match=r"model\.keras changed since the registry recorded"):
        warm_source("v1", registry, "v1", str(tmp_path / "w1"))
