"""Functions a reader can hold: in components/, pipeline/ and beam/, at most MAX_LONG
functions run over LONG lines (those that are left are named here, so a new one is a choice)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONG = 60
MAX_LONG = 3
# Left long, each for a reason: the app's routes share one closure over its state; the shape's
# choice reads as one argument; the recovery loop's states are clearest in one place.
KNOWN_LONG = {"components/serve/app.py:create_app", "components/detector/fitted_shape.py:fit_shape",
              "components/train/loop.py:fit_with_recovery"}


def long_functions() -> dict[str, int]:
    found = {}
    for package in ("components", "pipeline", "beam"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = node.end_lineno - node.lineno + 1
                    if length > LONG:
                        found[f"{path.relative_to(ROOT).as_posix()}:{node.name}"] = length
    return found


def test_at_most_three_functions_run_over_sixty_lines():
    found = long_functions()
    assert len(found) <= MAX_LONG and set(found) <= KNOWN_LONG, found
