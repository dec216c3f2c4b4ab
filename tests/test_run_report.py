"""The run report and the data step's page: self-contained (nothing fetched from anywhere),
every section present, every picture embedded."""

import json
from markupsafe import escape  # as jinja2 escapes the page
from html.parser import HTMLParser

import pytest

from components.model_registry.decision import DecisionRecord
from components.report.run_report import RunInputs, write_run_report


class _Resources(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.links, self.scripts, self.ids = [], [], 0, set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag in ("link", "script", "iframe", "object", "embed", "source", "video", "audio"):
            self.scripts += 1
        for key in ("href", "src"):
            if key in attrs:
                self.links.append(attrs[key])
        if "id" in attrs:
            self.ids.add(attrs["id"])


def check_self_contained(html: str) -> _Resources:
    found = _Resources()
    found.feed(html)
    assert "http://" not in html and "https://" not in html and "url(" not in html
    assert found.scripts == 0
    assert all(src.startswith("data:image/png;base64,") for src in found.images)
    assert all(link.startswith(("#", "data:")) for link in found.links)
    return found


@pytest.fixture(scope="module")
def evaluated(trained_model, demo_shards, tmp_path_factory):
    from components.evaluate.champion import evaluate_against_champion
    from components.model_registry.decision import PromotionRule

    out = tmp_path_factory.mktemp("evaluation")
    evaluate_against_champion(str(trained_model), str(demo_shards), str(out), PromotionRule())
    return out


def test_run_report_has_every_section_and_embeds_every_picture(demo_shards, trained_model, evaluated, tmp_path):
    from components.probe.probe_report import run_probe, write_probe

    probe = tmp_path / "probe.json"
    write_probe(run_probe(require_gpu=False), probe, None)
    path = write_run_report(RunInputs(
        dataset_dir=str(demo_shards), probe_json=str(probe), train_dir=str(trained_model),
        evaluation_dir=str(evaluated), decision_json=str(evaluated / "decision.json"),
        registered={"version": "v1", "status": "blessed", "champion": "v1"}), tmp_path / "run_report.html")
    html = path.read_text()
    found = check_self_contained(html)
    assert {"dataset", "probe", "training", "evaluation", "champion"} <= found.ids
    # class and box-size histograms, loss curve, five evaluation pictures
    assert len(found.images) >= 8
    manifest = json.loads((demo_shards / "manifest.json").read_text())
    assert f'<td class="num">{manifest["records_in"]}</td>' in html
    for name, count in manifest["class_boxes"]["train"].items():  # boxes per split and class, as written
        assert f'<td>{name}</td><td class="num">{count}</td><td class="num">' \
               f'{manifest["class_boxes"]["val"].get(name, 0)}</td>' in html
    # The evaluation's own decision, whichever way it went, with the floor it was held to.
    decision = DecisionRecord.read(evaluated / "decision.json")
    assert decision.champion is None and decision.baseline is not None
    assert escape(decision.reason) in html and escape(decision.floor_line()) in html
    assert "Registered as <b>v1</b>" in html
