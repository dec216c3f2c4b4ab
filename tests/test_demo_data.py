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
