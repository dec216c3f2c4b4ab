"""The shard contract is complete: every name a step shares with another through files (the
tf.Example feature keys, the files a build writes beside its shards, the shard names and
patterns) is declared once in beam/contract/ and read from there. The import test cannot see a
copied string; this one can: a string constant equal to a contract string anywhere else in
beam/, components/ or pipeline/ (docstrings aside) fails it. Benchmarks (the TF OD API
baseline writes its own keys on purpose) and tests' fixtures are not scanned."""

import ast
from pathlib import Path

from beam.contract import feature_keys, manifest, shard_names, train_keys

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("beam", "components", "pipeline")
CONTRACT_DIR = ROOT / "beam" / "contract"
# Too generic to be a contract string on its own (".gz" is every gzip file's suffix).
GENERIC = {shard_names.GZIP_SUFFIX}


def contract_strings() -> dict[str, str]:
    """Each contract string and the name it is declared under."""
    found = {}
    for module in (shard_names, feature_keys, train_keys, manifest):  # where each is declared first
        for name, value in vars(module).items():
            if not name.lstrip("_").isupper():
                continue
            for item in (value if isinstance(value, tuple) else (value,)):
                if isinstance(item, str) and item not in GENERIC:
                    found.setdefault(item, f"{module.__name__}.{name}")
    for split in ("train", "val"):
        found[manifest.stats_file_name(split)] = "beam.contract.manifest.stats_file_name"
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def copies(strings: dict[str, str]) -> list[str]:
    out = []
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            if CONTRACT_DIR in path.parents:
                continue
            tree = ast.parse(path.read_text())
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                        and node.value in strings):
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r} (declared as "
                               f"{strings[node.value]})")
    return out


def test_the_contract_declares_the_files_and_keys_steps_share():
    strings = contract_strings()
    for expected in ("image/encoded", "image/object/class/text", "detpipe/box_width", "manifest.json",
                     "label_map.json", "label_map.pbtxt", "schema.pbtxt", "stats-train.pb", "anomalies.txt",
                     "stats.html", "train_keys.txt", "rejects-*.jsonl", ".tfrecord", "{split}-*.tfrecord*"):
        assert expected in strings, expected


def test_no_contract_string_is_written_outside_the_contract():
    assert copies(contract_strings()) == []


def test_a_copied_contract_string_would_be_found(tmp_path, monkeypatch):
    module = ROOT / "components" / "_copied_for_the_test.py"
    module.write_text('"""A docstring naming label_map.json is fine."""\n\nNAME = "label_map.json"\n'
                      'SHARD = f"{1}.tfrecord"\n')
    try:
        found = copies(contract_strings())
    finally:
        module.unlink()
    assert found == ["components/_copied_for_the_test.py:3: 'label_map.json' (declared as "
                     "beam.contract.manifest.LABEL_MAP_FILE)",
                     "components/_copied_for_the_test.py:4: '.tfrecord' (declared as "
                     "beam.contract.shard_names.SHARD_SUFFIX)"]
