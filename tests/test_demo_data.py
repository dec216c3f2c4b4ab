import pytest
import xml.etree.ElementTree as ET

from PIL import Image

from pipeline.demo_data import (
    CLASSES, MAX_OBJECT, MAX_OVERLAP_IOU, MIN_OBJECT, _iou, render_demo_image, write_demo_dataset,
)


def test_same_seed_same_files_other_seed_other_files(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    write_demo_dataset(a, num_train=5, num_val=2, seed=7)
    write_demo_dataset(b, num_train=5, num_val=2, seed=7)
    write_demo_dataset(c, num_train=5, num_val=2, seed=8)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 16  # 7 images, 7 VOC files, coco.json, labels.csv
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert any((a / f).read_bytes() != (c / f).read_bytes() for f in files)


def test_voc_annotations_match_images(tmp_path):
    write_demo_dataset(tmp_path, num_train=6, num_val=2, seed=1)
    for xml in sorted((tmp_path / "annotations").glob("*.xml")):
        root = ET.parse(xml).getroot()
        image = Image.open(tmp_path / "images" / root.findtext("filename"))
        assert (int(root.findtext("size/width")), int(root.findtext("size/height"))) == image.size
        objects = root.findall("object")
        assert 1 <= len(objects) <= 3
        for obj in objects:
            assert obj.findtext("name") in CLASSES
            x0, y0, x1, y1 = (int(obj.findtext(f"bndbox/{k}")) for k in ("xmin", "ymin", "xmax", "ymax"))
            assert 0 <= x0 < x1 <= image.width and 0 <= y0 < y1 <= image.height


def test_objects_are_sized_and_separated_as_documented():
    for seed in range(40):
        _, objects = render_demo_image(seed=seed)
        for i, obj in enumerate(objects):
            x0, y0, x1, y1 = obj.box
            assert MIN_OBJECT <= x1 - x0 <= MAX_OBJECT
            for other in objects[i + 1:]:
                assert _iou(obj.box, other.box) <= MAX_OVERLAP_IOU


def test_the_default_demo_images_are_unchanged_by_the_size_options():
    """The built-in demo (26-58 px shapes in 128 px squares) renders exactly as before the
    size options existed: pixels and boxes of the first 40 seeds."""
    import hashlib

    digest = hashlib.sha256()
    for seed in range(40):
        image, objects = render_demo_image(seed)
        digest.update(image.tobytes())
        digest.update(repr([(o.name, o.box) for o in objects]).encode())
    assert digest.hexdigest() == "fa2f01b872e9bc6c8fe836d6a11055326587f74cd8eb2224244ef483f292201f"


def test_small_objects_in_larger_images_of_varied_size():
    widths, heights, sides = set(), set(), []
    for seed in range(60):
        image, objects = render_demo_image(seed, object_size=(9, 22), image_size=(280, 400))
        assert 280 <= image.width <= 400 and 280 <= image.height <= 400
        widths.add(image.width)
        heights.add(image.height)
        for o in objects:
            x0, y0, x1, y1 = o.box
            assert 0 <= x0 < x1 <= image.width and 0 <= y0 < y1 <= image.height
            sides.append(min(x1 - x0, y1 - y0))
    assert len(widths) > 10 and len(heights) > 10  # not one size
    assert min(sides) >= 9 and max(sides) <= 26 and sum(sides) / len(sides) < 20  # triangles may be 1.2x wide


def test_objects_larger_than_the_image_are_capped_by_it():
    image, objects = render_demo_image(3, object_size=(40, 90), image_size=(48, 48))
    assert image.size == (48, 48) and objects
    assert all(o.box[2] <= 48 and o.box[3] <= 48 for o in objects)


def test_demo_data_size_options_are_checked(tmp_path, capsys):
    from pipeline.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["demo-data", str(tmp_path / "d"), "--object-size", "22-9"])
    assert exit_info.value.code == 2 and "MIN <= MAX" in capsys.readouterr().err
    assert main(["demo-data", str(tmp_path / "d"), "--train", "3", "--val", "1", "--object-size", "9-22",
                 "--image-size", "280-400"]) == 0
    assert len(list((tmp_path / "d" / "images").glob("*.jpg"))) == 4
