"""The images an INT8 conversion calibrates its value ranges on: train records, prepared by the
evaluation's own preprocessing (`records.to_model_image`: the whole photo resized to the model's
size, divided by 255), so the ranges are those the file meets when it answers."""

from __future__ import annotations

from typing import Callable, Iterator


def calibration_images(data_dir: str, image_size: int, count: int) -> Callable[[], Iterator[list]]:
    """The converter's `representative_dataset`: the first `count` train images (shard order,
    so the same file from the same shards), one `[1, S, S, 3]` float32 input per step."""
    from components.detector.records import count_records, eval_examples, to_model_image

    if count < 1:
        raise ValueError(f"calibration needs at least 1 image, got {count}")
    if count_records(data_dir, "train") == 0:
        raise ValueError(f"{data_dir} has no train records to calibrate the INT8 file on")

    def images() -> Iterator[list]:
        examples = eval_examples(data_dir, "train", shorter_side=image_size).take(count)
        for example in examples:
            yield [to_model_image(example["image"], image_size)[None].numpy()]

    return images
