"""`label_review.html`: the flagged label issues as a person reviews them, best first: a crop
of each image around the issue with the label (green), the disagreeing prediction (red) and
the label a duplicate repeats (blue) drawn, what kind of problem it likely is, the class, the score and the evidence. Self-contained
(crops embedded as PNG), like the run report."""

from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image, ImageDraw

from beam.contract.data_text import page_environment
from components.review.label_review import MISSING, LabelIssue, summary_sentence

PAGE_FILE = "label_review.html"
PAGE_LIMIT = 200  # issues shown (the jsonl has every flagged one)
CROP_MARGIN = 0.5  # the crop extends this many box sides beyond the box, so the context shows
CROP_SIDE = 220  # px: the longer side of a crop on the page
LABEL, PREDICTION, REPEATED = (40, 170, 60), (220, 40, 40), (40, 90, 220)

# Class and file names come from strangers' datasets (a class named `<script>...` must reach the
# page as text): the pages' one environment (autoescape on, control characters made visible).
_TEMPLATE = page_environment().from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>detpipe label review</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
.issues { display: flex; flex-wrap: wrap; gap: 1em; }
figure { margin: 0; width: {{ side + 20 }}px; border: 1px solid #ddd; padding: 8px; }
figcaption { font-size: 0.85em; line-height: 1.35; }
.kind { font-weight: 600; }
.legend span { display: inline-block; width: 1em; height: 0.6em; margin: 0 0.3em 0 1em; }
</style></head><body>
<h1>Label review</h1>
<p>{{ summary }}. {{ reviewed }}</p>
<p class="legend">Drawn:<span style="background: rgb{{ label }}"></span>the label
<span style="background: rgb{{ prediction }}"></span>the model's prediction
<span style="background: rgb{{ repeated }}"></span>the label a duplicate repeats. Lower scores are more likely wrong;
best first{% if shown < flagged %} (the first {{ shown }} of {{ flagged }}; every one is in label_review.jsonl){% endif %}.</p>
<div class="issues">
{% for item in items %}<figure><img alt="{{ item.issue.kind }} in {{ item.issue.image }}" src="{{ item.uri }}">
<figcaption><span class="kind">{{ loop.index }}. {{ item.issue.kind }}</span>: {{ item.issue.class_name }},
score {{ '%.3f' | format(item.issue.score) }}<br><code>{{ item.issue.image }}</code>
box {{ item.issue.box | map('int') | join(', ') }}{% if item.issue.evidence %}<br>prediction: {{ item.issue.evidence.class_name }}
{{ '%.2f' | format(item.issue.evidence.score) }}{% endif %}{% if item.issue.repeats %}<br>repeats the label at
{{ item.issue.repeats | map('int') | join(', ') }}{% endif %}</figcaption></figure>
{% endfor %}</div>
{% if not items %}<p>Nothing to review: no label disagrees with the model's confident predictions.</p>{% endif %}
</body></html>
""")


def crop_uri(image_bytes: bytes, issue: LabelIssue) -> str:
    """A PNG data URI of the image around the issue, the label and the prediction drawn."""
    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    boxes = [issue.box] + ([issue.evidence.box] if issue.evidence else []) + ([issue.repeats] if issue.repeats else [])
    x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    x1, y1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    pad = CROP_MARGIN * max(x1 - x0, y1 - y0, 8.0)
    left, top = max(0, int(x0 - pad)), max(0, int(y0 - pad))
    right, bottom = min(image.width, int(x1 + pad) + 1), min(image.height, int(y1 + pad) + 1)
    crop = image.crop((left, top, max(right, left + 1), max(bottom, top + 1)))
    scale = CROP_SIDE / max(crop.width, crop.height)
    crop = crop.resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))))
    draw = ImageDraw.Draw(crop)

    def rectangle(box, colour, width=2):
        draw.rectangle([(box[0] - left) * scale, (box[1] - top) * scale, (box[2] - left) * scale,
                        (box[3] - top) * scale], outline=colour, width=width)

    if issue.evidence:
        rectangle(issue.evidence.box, PREDICTION)
    if issue.kind != MISSING:  # a missing box has no label to draw: its box is the prediction
        rectangle(issue.box, LABEL, width=6 if issue.repeats else 2)
    if issue.repeats:  # thin on the copy's thick line: both show where they coincide
        rectangle(issue.repeats, REPEATED)
    buffer = io.BytesIO()
    crop.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def write_review_page(issues: list[LabelIssue], images: dict[str, bytes], path: str | Path, reviewed: str,
                      weak: str = "") -> Path:
    """The page of the flagged `issues` (most likely first); `images`: each image's encoded bytes
    by its id; `reviewed`: a sentence saying what was reviewed with which model; `weak`: why that
    model could not judge (label_review.too_weak), said in the page's summary."""
    flagged = [i for i in issues if i.flagged]
    items = [{"issue": issue, "uri": crop_uri(images[issue.image], issue)} for issue in flagged[:PAGE_LIMIT]
             if issue.image in images]
    path = Path(path)
    path.write_text(_TEMPLATE.render(summary=summary_sentence(issues, weak), reviewed=reviewed, items=items,
                                     shown=len(items), flagged=len(flagged), side=CROP_SIDE, label=LABEL,
                                     prediction=PREDICTION, repeated=REPEATED))
    return path
