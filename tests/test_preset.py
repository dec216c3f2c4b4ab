"""`--preset`: the code path that starts from a KerasHub preset, tested up to the download
(no network in tests) and past it with a local preset folder."""

import numpy as np
import pytest


def test_builtin_preset_goes_to_the_download_and_fails_clearly_without_network(monkeypatch):
    from keras_hub.src.utils import preset_utils

    from components.detector.model import PresetUnavailable, backbone_from_preset

    requested = []

    def no_network(preset, path):
        requested.append((preset, path))
        raise OSError("network is unreachable")

    monkeypatch.setattr(preset_utils, "get_file", no_network)
    with pytest.raises(PresetUnavailable, match="could not load preset 'retinanet_resnet50_fpn_coco': network is unreachable. Without network"):
        backbone_from_preset("retinanet_resnet50_fpn_coco")
    assert requested and requested[0][0] == "retinanet_resnet50_fpn_coco"


def test_unknown_preset_is_named_with_the_known_ones():
    from components.detector.model import PresetUnavailable, backbone_from_preset

    with pytest.raises(PresetUnavailable, match="unknown preset 'retinanet_nope'.*retinanet_resnet50_fpn_coco"):
        backbone_from_preset("retinanet_nope")


@pytest.mark.slow  # trains a model: `make test` runs it, `make test-fast` not
def test_training_starts_from_a_local_preset_folder(demo_shards, tmp_path):
    """A preset saved to a folder (as one copied from Kaggle would be) trains with new heads
    for the dataset's classes, starting from the preset's backbone weights."""
    from components.detector.model import ModelConfig, backbone_from_preset, build_detector
    from components.train.trainer import TrainConfig, train_detector

    source = build_detector(ModelConfig(num_classes=7, image_size=64, backbone_filters=(64, 32, 32, 32),
                                        min_level=4, max_level=5))
    preset = tmp_path / "preset"
    source.backbone.save_to_preset(str(preset))
    loaded = backbone_from_preset(str(preset))
    for a, b in zip(source.backbone.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)

    result = train_detector(TrainConfig(data_dir=str(demo_shards), output_dir=str(tmp_path / "model"), epochs=1,
                                        batch_size=4, image_size=64, max_steps=2, preset=str(preset)))
    assert np.isfinite(result.final_loss) and f"preset {preset}" in result.decisions["model"]
