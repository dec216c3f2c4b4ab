"""The documentation: the site builds with no broken link or anchor, the README stays short
and its links resolve, and the troubleshooting page has a line for every reject reason of
the data step and every check of the probe."""

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).parent / "mkdocs"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    run = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


def test_the_site_builds_strictly_and_works_opened_from_disk(site):
    """One PAGE.html a page (links work from file://), menu titles that are the pages' titles,
    nothing fetched from the network, code highlighted at build time and code blocks that
    stay blocks (fenced blocks once sat inside numbered lists and ran together as one line)."""
    import yaml

    built = {p.relative_to(site).as_posix() for p in site.glob("*.html")} - {"404.html"}
    pages = {p.stem for p in (REPO / "docs").glob("*.md")}
    assert built == {f"{page}.html" for page in pages}
    for entry in yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"][1:]:
        (title, page), = entry.items()
        heading = (REPO / "docs" / page).read_text().splitlines()[0].removeprefix("# ")
        assert heading.split(":")[0] == title, (title, heading)
    for html in site.rglob("*.html"):
        text = html.read_text()
        assert not re.search(r'(src|href)="(https?:)?//(?!127\.0\.0\.1)[^"]*\.(js|css)', text), html
    vertex = (site / "vertex.html").read_text()
    assert vertex.count('<div class="codehilite"><pre>') >= 4 and "```" not in vertex


def test_every_command_s_help_ends_with_its_page(site):
    from pipeline.cli import DOCS_PAGE, build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) - {"data"} | {"data build"} == set(DOCS_PAGE)
    for name, page in DOCS_PAGE.items():
        command = commands["data"]._actions[-1].choices["build"] if name == "data build" else commands[name]
        assert command.format_help().rstrip().endswith(f"More in docs/{page}."), name
        file, _, anchor = page.partition("#")
        html = (site / file.replace(".md", ".html")).read_text()
        assert not anchor or f'id="{anchor}"' in html, f"{name}: no #{anchor} in {file}"


def test_the_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links and all((REPO / link).exists() for link in links), links
    assert {Path(link).name for link in links if link.startswith("docs/")} == {
        p.name for p in (REPO / "docs").glob("*.md") if p.name != "index.md"}


def _string_constants(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    return {node.targets[0].id: node.value.value for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def test_troubleshooting_names_every_reject_reason_and_probe_check():
    page = (REPO / "docs" / "troubleshooting.md").read_text()
    reasons = [value for name, value in _string_constants(REPO / "beam" / "contract" / "rejects.py").items()
               if re.fullmatch(r"[a-z_]+", value) and name.isupper()]
    checks = set(re.findall(r'CheckResult\(\s*"([a-z_]+)"', (REPO / "components" / "probe" / "checks.py").read_text()
                            + (REPO / "components" / "probe" / "probe_report.py").read_text()))
    assert len(reasons) >= 12 and len(checks) >= 12
    missing = [name for name in [*reasons, *sorted(checks)] if f"| `{name}` |" not in page]
    assert not missing, f"no line in docs/troubleshooting.md for {missing}"
