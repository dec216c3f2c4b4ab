"""Champion against challenger: the re-weighted COCO accumulation, the paired bootstrap,
the promotion rule, and comparing models whose label maps differ."""


import numpy as np
import pytest

from components.evaluate.bootstrap import match_table, paired_bootstrap, resample_weights, weighted_scores
from components.evaluate.champion import compare_and_decide, decision_markdown
from components.model_registry.decision import comparison_line
from components.detector.coco_metrics import ImageDetections, ImageTruth
from components.evaluate.baseline import box_prior_baseline, prototypes
from components.model_registry.decision import DeltaInterval, PromotionRule, decide, readable
from tests.scenes import NAMES, pycocotools_evaluation
from tests.scenes import scene as _scene

def _without_class(d: ImageDetections, class_id: int) -> ImageDetections:
    keep = [i for i, c in enumerate(d.labels) if c != class_id]
    return ImageDetections(d.image_id, [d.boxes[i] for i in keep], [d.scores[i] for i in keep],
                           [d.labels[i] for i in keep])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unit_weights_give_pycocotools_map_and_ap50(seed):
    truths, found = _scene(seed)
    reference = pycocotools_evaluation(truths, found, NAMES)
    scores = weighted_scores(match_table(truths, found, NAMES), np.ones((1, len(truths))))
    assert scores.map[0] == pytest.approx(reference.stats[0], abs=1e-12)
    assert scores.ap50[0] == pytest.approx(reference.stats[1], abs=1e-12)
    precision = reference.eval["precision"][:, :, :, 0, -1]
    for k in range(3):
        values = precision[:, :, k]
        assert scores.per_class[0][k] == pytest.approx(values[values > -1].mean(), abs=1e-12)


def test_weights_are_resampling():
    """Weight 2 on an image is the same as the image twice; weight 0 as leaving it out."""
    truths, found = _scene(3, images=20)
    table = match_table(truths, found, NAMES)
    weights = np.ones((1, 20))
    weights[0, 4], weights[0, 7] = 0, 2
    kept = [i for i in range(20) if i != 4] + [7]
    twice_t, twice_d = [], []
    for n, i in enumerate(kept, start=1):
        t, d = truths[i], found[i]
        twice_t.append(ImageTruth(n, t.height, t.width, t.boxes, t.labels, t.difficult))
        twice_d.append(ImageDetections(n, d.boxes, d.scores, d.labels))
    reference = pycocotools_evaluation(twice_t, twice_d, NAMES)
    assert weighted_scores(table, weights).map[0] == pytest.approx(reference.stats[0], abs=1e-3)


def test_perfect_and_empty_predictions():
    truths, _ = _scene(4, images=15)
    perfect = [ImageDetections(t.image_id, t.boxes, [0.9] * len(t.boxes), t.labels) for t in truths]
    nothing = [ImageDetections(t.image_id, [], [], []) for t in truths]
    assert weighted_scores(match_table(truths, perfect, NAMES), np.ones((1, 15))).map[0] == pytest.approx(1.0)
    assert weighted_scores(match_table(truths, nothing, NAMES), np.ones((1, 15))).map[0] == 0.0


def test_paired_bootstrap_identical_better_and_seeded():
    truths, found = _scene(5)
    perfect = [ImageDetections(t.image_id, t.boxes, [0.9] * len(t.boxes), t.labels) for t in truths]
    same = paired_bootstrap(match_table(truths, found, NAMES), match_table(truths, found, NAMES), resamples=200)
    assert (same.delta_map.delta, same.delta_map.low, same.delta_map.high) == (0.0, 0.0, 0.0)
    better = paired_bootstrap(match_table(truths, perfect, NAMES), match_table(truths, found, NAMES), resamples=200)
    assert better.delta_map.low > 0 and better.delta_map.low <= better.delta_map.delta <= better.delta_map.high
    again = paired_bootstrap(match_table(truths, perfect, NAMES), match_table(truths, found, NAMES), resamples=200)
    assert again.delta_map == better.delta_map  # seeded
    weights = resample_weights(10, 1000, seed=0)
    assert weights.shape == (1001, 10) and (weights.sum(axis=1) == 10).all() and (weights[0] == 1).all()


@pytest.mark.parametrize("rule,delta,blessed,words", [
    (PromotionRule(), DeltaInterval(0.011, -0.004, 0.027), True, "not worse"),
    (PromotionRule(), DeltaInterval(-0.005, -0.02, 0.004), True, "not worse"),  # indistinguishable: newer data wins
    (PromotionRule(), DeltaInterval(-0.05, -0.08, -0.02), False, "entirely below -0.010"),
    (PromotionRule(max_regression=0.1), DeltaInterval(-0.05, -0.08, -0.02), True, "not worse"),
    (PromotionRule("better"), DeltaInterval(0.011, -0.004, 0.027), False, "not shown to be better"),
    (PromotionRule("better"), DeltaInterval(0.03, 0.01, 0.05), True, "better than the champion"),
])
def test_promotion_rule(rule, delta, blessed, words):
    verdict = decide(rule, 0.3, delta)
    assert verdict.blessed is blessed and words in verdict.reason


def test_min_map_and_first_version():
    assert decide(PromotionRule(min_map=0.5), 0.3, None).below_min_map
    assert not decide(PromotionRule(min_map=0.5), 0.3, DeltaInterval(0.2, 0.1, 0.3)).blessed
    assert decide(PromotionRule(), 0.0, None).reason.startswith("no champion yet")
    with pytest.raises(ValueError, match="promote_if"):
        PromotionRule("sometimes")


def test_a_clearly_worse_challenger_is_rejected_and_the_record_says_why():
    truths, found = _scene(6, images=80)
    perfect = [ImageDetections(t.image_id, t.boxes, [0.9] * len(t.boxes), t.labels) for t in truths]
    label_map = {v: k for k, v in NAMES.items()}
    record = compare_and_decide(truths, found, label_map, 0.3, PromotionRule(),
                                {"version": "v3", "detections": perfect, "label_map": label_map},
                                val_fingerprint="ab" * 32, resamples=300)
    assert record.blessed is False and record.verdict == "rejected"
    assert record.delta["mAP"]["high"] < -0.01 and record.champion["mAP_shared"] == pytest.approx(1.0)
    assert set(record.delta["per_class"]) == set(label_map)
    assert record.rule["resamples"] == 300 and record.val == {"images": 80, "fingerprint": "ab" * 32}
    line = comparison_line(record)
    assert line.startswith("champion v3 mAP 1.000 vs challenger") and "on the same 80 val images" in line
    assert line.endswith("rejected (not_worse)")
    assert "| square |" in decision_markdown(record)


def test_different_label_maps_are_compared_on_the_shared_classes():
    truths, found = _scene(7)
    challenger_map = {"circle": 1, "square": 2, "triangle": 3}
    champion_map = {"circle": 1, "square": 2, "hexagon": 3}  # never saw triangles
    champion_found = [_without_class(d, 3) for d in found]  # id 3 is its hexagon: no triangles found
    record = compare_and_decide(truths, found, challenger_map, 0.3, PromotionRule(),
                                {"version": "v1", "detections": champion_found, "label_map": champion_map},
                                resamples=100)
    assert record.classes == {"shared": ["circle", "square"], "challenger_only": ["triangle"],
                                 "champion_only": ["hexagon"]}
    assert set(record.delta["per_class"]) == {"circle", "square"}
    assert record.delta["mAP"]["delta"] == 0.0  # the same detections on the shared classes
    assert "on the same 60 val images (2 shared classes)" in comparison_line(record)
    nothing_shared = compare_and_decide(truths, found, challenger_map, 0.3, PromotionRule(),
                                        {"version": "v1", "detections": found, "label_map": {"car": 1}})
    assert not nothing_shared.blessed and "no class in common" in nothing_shared.reason


def _train_boxes(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A train split drawn like the scene's val split."""
    truths, _ = _scene(seed, images=200)
    return (np.array([b for t in truths for b in t.boxes]).reshape(-1, 4),
            np.array([label for t in truths for label in t.labels]))


def test_a_model_that_learned_nothing_is_recorded_but_never_blessed_even_first():
    truths, found = _scene(8, images=60)
    label_map = {v: k for k, v in NAMES.items()}
    baseline = box_prior_baseline(truths, NAMES, *_train_boxes(9))
    assert 0 < baseline.metrics["mAP"] < 0.1 and baseline.boxes_per_class == 10
    nothing = [ImageDetections(t.image_id, [], [], []) for t in truths]
    for detections, score in ((nothing, 0.0), (found, baseline.metrics["mAP"] / 2)):
        record = compare_and_decide(truths, detections, label_map, score, PromotionRule(), baseline=baseline)
        assert not record.blessed and not record.below_min_map  # rejected, but the run does not fail
        assert "does not beat the box-prior baseline" in record.reason
        assert record.baseline["mAP"] == pytest.approx(baseline.metrics["mAP"], abs=1e-8)
        assert "does not beat the box-prior baseline" in comparison_line(record)
        assert "Floor: the box-prior baseline" in decision_markdown(record)
    good = compare_and_decide(truths, found, label_map, 0.3, PromotionRule(), baseline=baseline)
    assert good.blessed and good.reason.startswith("no champion yet")


def test_against_a_champion_the_floor_still_decides_and_the_line_says_both():
    truths, found = _scene(10, images=60)
    label_map = {v: k for k, v in NAMES.items()}
    baseline = box_prior_baseline(truths, NAMES, *_train_boxes(11))
    nothing = [ImageDetections(t.image_id, [], [], []) for t in truths]
    record = compare_and_decide(truths, nothing, label_map, 0.0, PromotionRule(max_regression=1.0),
                                {"version": "v2", "detections": nothing, "label_map": label_map},
                                resamples=50, baseline=baseline)
    line = comparison_line(record)
    assert not record.blessed and line.startswith("champion v2 mAP 0.000 vs challenger 0.000")
    assert line.endswith("the model learned nothing usable")


def test_prototypes_are_the_most_common_boxes_first():
    common = [[0.1, 0.1, 0.5, 0.5]] * 5 + [[0.12, 0.1, 0.5, 0.5]] * 3
    rare = [[0.6, 0.6, 0.9, 0.95]] * 2
    chosen = prototypes(np.array(common + rare + [[0.0, 0.0, 0.01, 0.01]]), limit=2)
    assert [box for box, _ in chosen] == [(0.1, 0.1, 0.5, 0.5), (0.6, 0.6, 0.9, 0.95)]
    assert [score for _, score in chosen] == pytest.approx([8 / 11, 2 / 11])
    assert len(prototypes(np.zeros((0, 4)), limit=3)) == 0


def test_numbers_that_round_to_zero_are_printed_with_digits_to_read():
    assert DeltaInterval(-0.0000016, -0.0000031, -0.0000004).text() == \
        "-0.0000016 (95% CI -0.0000031 .. -0.0000004)"
    assert DeltaInterval(0.011, -0.004, 0.027).text() == "+0.011 (95% CI -0.004 .. +0.027)"
    assert readable(0.00009, 0.0123) == ["0.000090", "0.012300"]
    assert "0.000090" in decide(PromotionRule(min_map=0.01), 0.00009, None).reason


def test_the_examples_in_the_promotion_modules_run():
    import doctest

    from components.evaluate import baseline, detections_file
    from components.fingerprint import fingerprint
    from components.model_registry import decision
    from components.review import fold_review, label_review

    for module in (baseline, decision, fingerprint, label_review, detections_file, fold_review):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_the_detection_cap_warning_names_how_often_it_decided():
    from components.evaluate.metrics_file import DetectionCap

    assert DetectionCap(100, 10).warning(20) is None  # half: not most
    line = DetectionCap(100, 11).warning(20)
    assert line.startswith("11 of 20 val images have 100 detections (the cap)")
    assert DetectionCap(100, 0).warning(0) is None
