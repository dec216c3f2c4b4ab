"""The label review reads a split's photos without TensorFlow (components/detector/split_photos.py,
beam/contract/tfrecord_framing.py): the same bytes as TensorFlow's reader, on shards the real data
step wrote, plain and GZIP; damaged framing named; shards of other converters left to TensorFlow."""

import gzip
import json
import shutil

import pytest


def test_the_photos_are_tensorflow_s_bytes_on_the_real_shards(raccoon_shards):
    import tensorflow as tf

    from beam.contract import feature_keys as K
    from components.detector.records import shard_files
    from components.detector.split_photos import split_photos
    from components.evaluate.evaluator import val_images

    photos = split_photos(str(raccoon_shards), "val")
    expected = {}
    for record in tf.data.TFRecordDataset(shard_files(str(raccoon_shards), "val")):
        parsed = tf.io.parse_single_example(record, {K.SOURCE_ID: tf.io.FixedLenFeature([], tf.string),
                                                     K.ENCODED: tf.io.FixedLenFeature([], tf.string)})
        expected[parsed[K.SOURCE_ID].numpy().decode()] = parsed[K.ENCODED].numpy()
    assert photos == expected and len(photos) == len(val_images(str(raccoon_shards))[0]) > 0


def test_gzip_shards_damage_and_other_converters(raccoon_shards, tmp_path):
    from beam.contract.shards import ShardWriter
    from beam.contract.tfrecord_framing import DamagedRecord, read_tfrecords
    from components.detector.split_photos import split_photos

    path = tmp_path / "val-00000-of-00001.tfrecord.gz"
    with ShardWriter(str(path), "val") as writer:  # the data step's writer, GZIP by its name
        for record in (b"one", b"", b"three" * 1000):
            writer.write(record)
    assert gzip.open(path).read()[:8] == (3).to_bytes(8, "little")
    assert list(read_tfrecords(str(path))) == [b"one", b"", b"three" * 1000]
    plain = tmp_path / "cut.tfrecord"
    plain.write_bytes(gzip.open(path).read()[:-3])
    with pytest.raises(DamagedRecord, match="cut.tfrecord: a record of 5000 bytes fails its checksum or is cut short"):
        list(read_tfrecords(str(plain)))
    other = tmp_path / "other"  # shards without the data step's manifest: TensorFlow reads them
    shutil.copytree(raccoon_shards, other)
    (other / "manifest.json").unlink()
    assert split_photos(str(other), "val") is None


@pytest.mark.parametrize("dropped", ["SOURCE_ID", "ENCODED"])
def test_a_record_without_its_source_id_or_image_is_left_to_tensorflow(raccoon_shards, tmp_path, dropped):
    from beam.contract import example_proto as pb
    from beam.contract import feature_keys as K
    from beam.contract.manifest import Manifest
    from beam.contract.shards import ShardWriter
    from beam.contract.tfrecord_framing import read_tfrecords
    from components.detector.split_photos import split_photos

    edited = tmp_path / "edited"
    shutil.copytree(raccoon_shards, edited)
    manifest = Manifest.from_dict(json.loads((edited / "manifest.json").read_text()))
    shard = next(s["name"] for s in manifest.shards if s["split"] == "val")
    records = list(read_tfrecords(str(edited / shard)))
    first = pb.Example.FromString(records[0])
    del first.features.feature[getattr(K, dropped)]
    with ShardWriter(str(edited / shard), "val") as writer:  # the data step's writer and framing
        for record in [first.SerializeToString(), *records[1:]]:
            writer.write(record)
    assert split_photos(str(raccoon_shards), "val") is not None
    assert split_photos(str(edited), "val") is None
