"""Installed packages against `uv.lock`: what drifted from what ran locally.

A package counts when it is both locked and installed and the versions differ; a
direct dependency of detpipe that is not installed at all is reported as missing.
Locked packages that are not installed are otherwise ignored: the lock also holds
packages for other platforms and for extras (the `gpu` one) this machine may not use.

Example:
    >>> lock = {"numpy": "1.26.4", "keras": "3.15.1"}
    >>> drifted_packages(lock, {"numpy": "2.0.0", "keras": "3.15.1"})
    [('numpy', '1.26.4', '2.0.0')]
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib
from pathlib import Path

LOCK_ENV = "DETPIPE_LOCK_FILE"
# Where the lock lives: next to the source tree (editable install, tests), or where
# infra/Dockerfile copies it in the image.
_LOCK_CANDIDATES = (Path(__file__).resolve().parents[2] / "uv.lock", Path("/opt/detpipe/uv.lock"))


def normalise(name: str) -> str:
    """PEP 503 name normalisation: `Foo_Bar.baz` → `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def find_lock_file() -> Path | None:
    if os.environ.get(LOCK_ENV):
        return Path(os.environ[LOCK_ENV])
    return next((p for p in _LOCK_CANDIDATES if p.is_file()), None)


def read_lock(path: Path) -> tuple[dict[str, str], list[str]]:
    """({package: locked version}, detpipe's direct dependencies) from a uv.lock file."""
    data = tomllib.loads(Path(path).read_text())
    versions, direct = {}, []
    for package in data.get("package", []):
        name = normalise(package["name"])
        if package.get("source", {}).get("editable") or package.get("source", {}).get("virtual"):
            direct = [normalise(d["name"]) for d in package.get("dependencies", [])]
            continue
        if "version" in package:
            versions[name] = package["version"]
    return versions, direct


def installed_packages() -> dict[str, str]:
    """The version Python imports for each distribution: the first found on sys.path
    (setuptools vendors older copies of some packages further down the path)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalise(name), dist.version)
    return found


def drifted_packages(locked: dict[str, str], installed: dict[str, str]) -> list[tuple[str, str, str]]:
    """(name, locked version, installed version) for each locked package installed at another version."""
    return sorted((name, version, installed[name]) for name, version in locked.items()
                  if name in installed and installed[name] != version)


def missing_packages(direct: list[str], installed: dict[str, str]) -> list[str]:
    return sorted(name for name in direct if name not in installed)


def package_facts(lock_path: Path | None = None) -> dict:
    """What the probe stores: the lock used, drifted and missing packages."""
    lock_path = lock_path or find_lock_file()
    installed = installed_packages()
    if lock_path is None or not Path(lock_path).is_file():
        return {"lock_file": None, "drifted": [], "missing": [], "installed_count": len(installed)}
    locked, direct = read_lock(Path(lock_path))
    return {
        "lock_file": str(lock_path),
        "drifted": [{"name": n, "locked": lv, "installed": iv} for n, lv, iv in drifted_packages(locked, installed)],
        "missing": missing_packages(direct, installed),
        "installed_count": len(installed),
        "versions": {name: installed[name] for name in sorted(set(locked) & set(installed))},
    }
