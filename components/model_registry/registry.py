"""A registry of model versions in a folder (local or gs://), one sub-folder per model name:

    REGISTRY/MODEL_NAME/
      champion.json              the blessed version; replaced atomically, written last
      versions/v1/
        claim.json               written first, exclusively: v1 belongs to this run
        saved_model/             the export `detpipe serve` loads
        label_map.json schema.pbtxt stats-train.pb metrics.json decision.json
        model.keras train_config.json   the trained weights a warm start continues
        version.json             written last: the version is complete (status, run id,
                                 data fingerprint, scores)

A rejected challenger is a version like any other, with status "rejected", for audit.
`champion.json` keeps the history of earlier champions and why each was chosen.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass

from beam.contract.manifest import LABEL_MAP_FILE, SCHEMA_FILE, stats_file_name
from components.model_registry.store import Conflict, Store, open_store

CHAMPION_FILE = "champion.json"
VERSION_FILE = "version.json"
CLAIM_FILE = "claim.json"
SAVED_MODEL_DIR = "saved_model"
# Files a version holds besides the SavedModel: name in the version → where it comes from.
DATA_FILES = (LABEL_MAP_FILE, SCHEMA_FILE, stats_file_name("train"))
_VERSION = re.compile(r"^v(\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


class RegistryError(ValueError):
    """A registry request that cannot be served (one line)."""


def resolve_registry(registry: str, pipeline_root: str) -> str:
    """The registry given, else `registry` under the pipeline root (so scheduled runs of one
    pipeline share it without configuration)."""
    if registry:
        return registry
    if not pipeline_root:
        raise RegistryError("no registry given and no pipeline root to put one under")
    return pipeline_root.rstrip("/") + "/registry"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _dump(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


DEFAULT_MODEL_NAME = "detpipe"  # the model's folder in a registry when none is named

@dataclass
class Registry:
    store: Store
    model_name: str = DEFAULT_MODEL_NAME

    @classmethod
    def open(cls, uri: str, model_name: str = DEFAULT_MODEL_NAME, client=None) -> "Registry":
        if not _NAME.match(model_name):
            raise RegistryError(f"model name {model_name!r}: use letters, digits, '.', '_' or '-' (at most 63)")
        return cls(open_store(uri, client), model_name)

    @property
    def uri(self) -> str:
        return self.store.join(self.model_name)

    def _rel(self, *parts: str) -> str:
        return "/".join((self.model_name, *parts))

    # ------------------------------------------------------------ reading

    def champion(self) -> dict | None:
        text = self.store.read_text(self._rel(CHAMPION_FILE))
        return json.loads(text) if text else None

    def champion_version(self) -> str:
        """The blessed version, or "" when there is none."""
        champion = self.champion()
        return champion["version"] if champion else ""

    def version_names(self) -> list[str]:
        names = [n for n in self.store.list_dirs(self._rel("versions")) if _VERSION.match(n)]
        return sorted(names, key=lambda n: int(n[1:]))

    def version(self, name: str) -> dict:
        """version.json of a complete version; a claimed but unfinished one reads as such."""
        if not _VERSION.match(name):
            raise RegistryError(f"{name!r} is not a version name (v1, v2, ...)")
        text = self.store.read_text(self._rel("versions", name, VERSION_FILE))
        if text:
            return json.loads(text)
        claim = self.store.read_text(self._rel("versions", name, CLAIM_FILE))
        if claim:
            return {**json.loads(claim), "version": name, "status": "incomplete"}
        raise RegistryError(f"no version {name} in {self.uri} (see `detpipe registry list`)")

    def versions(self) -> list[dict]:
        return [self.version(name) for name in self.version_names()]

    def path(self, version: str, *parts: str) -> str:
        return self.store.join(self._rel("versions", version, *parts))

    def fetch(self, version: str, rel: str, local_dir: str) -> str:
        """Copy a folder of a version (e.g. the SavedModel) to `local_dir`; returns it."""
        self.store.download_dir(self._rel("versions", version, rel), local_dir)
        return local_dir

    def _fetch_files(self, version: str, names: tuple[str, ...], local_dir: str) -> dict[str, str]:
        """The files `names` of a version, copied to `local_dir` ({name: local path}, only
        those the version holds)."""
        import os

        os.makedirs(local_dir, exist_ok=True)
        found = {}
        for name in names:
            target = os.path.join(local_dir, name)
            if self.store.download_file(self._rel("versions", version, name), target):
                found[name] = target
        return found

    def fetch_data_files(self, version: str, local_dir: str) -> dict[str, str]:
        """The version's label map, schema and training statistics, copied to `local_dir`
        ({name: local path}, only those the version holds)."""
        return self._fetch_files(version, DATA_FILES, local_dir)

    def fetch_training_files(self, version: str, local_dir: str) -> bool:
        """The version's trained weights and training config (what a warm start needs) and,
        when it has them, its train images' keys, copied to `local_dir`; False when the version
        has no weights (recorded before they were kept)."""
        from components.detector.artifacts import WARM_START_EXTRAS, WARM_START_FILES

        from components.model_registry.checksums import CHECKSUM_FILE, verify_files

        found = self._fetch_files(version, WARM_START_FILES + WARM_START_EXTRAS, local_dir)
        recorded = self.read_file(version, CHECKSUM_FILE)
        if recorded:  # the copies are what the warm start loads; versions written before checksums have none
            verify_files(local_dir, json.loads(recorded), names=set(found), named_as=self.path(version))
        return all(name in found for name in WARM_START_FILES)

    def champion_data(self, local_dir: str) -> tuple[str, dict[str, str], dict[str, int] | None]:
        """What the data step checks new data against: the champion's version ("" for none),
        its data files copied to `local_dir` ({name: path}) and its label map."""
        version = self.champion_version()
        files = self.fetch_data_files(version, local_dir) if version else {}
        label_map = None
        if LABEL_MAP_FILE in files:
            with open(files[LABEL_MAP_FILE]) as handle:
                label_map = json.load(handle)
        return version, files, label_map

    def read_file(self, version: str, name: str) -> str | None:
        return self.store.read_text(self._rel("versions", version, name))

    # ------------------------------------------------------------ writing

    def claim_version(self, run_id: str) -> str:
        """The next free version name, claimed exclusively (two runs finishing together get
        different numbers)."""
        existing = self.version_names()
        number = int(existing[-1][1:]) + 1 if existing else 1
        for _ in range(100):
            name = f"v{number}"
            try:
                self.store.create(self._rel("versions", name, CLAIM_FILE),
                                  _dump({"run_id": run_id, "claimed": _now()}))
                return name
            except Conflict:
                number += 1
        raise RegistryError(f"could not claim a version in {self.uri} after 100 tries")

    def write_version(self, name: str, saved_model_dir: str, files: dict[str, str], record: dict) -> dict:
        """Upload the SavedModel and `files` ({name in the version: local path}), then
        version.json (the version is complete once it exists)."""
        import tempfile
        from pathlib import Path

        from components.model_registry.checksums import folder_checksums, write_checksums

        model_sums = folder_checksums(saved_model_dir)  # what serve, predict and deploy check (checksums.py)
        self.store.upload_dir(saved_model_dir, self._rel("versions", name, SAVED_MODEL_DIR))
        with tempfile.TemporaryDirectory() as tmp:
            for target, source in files.items():
                Path(tmp, target).write_bytes(Path(source).read_bytes())
            file_sums = folder_checksums(tmp)  # what the warm start checks
            write_checksums(tmp, file_sums)
            Path(tmp, SAVED_MODEL_DIR).mkdir()
            write_checksums(str(Path(tmp, SAVED_MODEL_DIR)), model_sums)
            self.store.upload_dir(tmp, self._rel("versions", name))
        record = {**record, "version": name, "model_name": self.model_name, "created": _now(),
                  "saved_model": self.path(name, SAVED_MODEL_DIR),
                  "sha256": {**file_sums, **{f"{SAVED_MODEL_DIR}/{rel}": digest for rel, digest in model_sums.items()}}}
        self.store.create(self._rel("versions", name, VERSION_FILE), _dump(record))
        return record

    def promotable(self, name: str) -> dict:
        """version.json of `name`; raises RegistryError unless it can be the champion."""
        version = self.version(name)
        if version.get("status") == "incomplete":
            raise RegistryError(f"version {name} is incomplete (its run did not finish): cannot be the champion")
        return version

    def set_champion(self, name: str, reason: str, by: str, expected: str | None) -> dict:
        """Make `name` the champion if the champion is still `expected` (its version, or
        None for none): raises `Conflict` when it moved meanwhile."""
        version = self.promotable(name)
        text = self.store.read_text(self._rel(CHAMPION_FILE))
        current = json.loads(text) if text else None
        if (current["version"] if current else None) != expected:
            raise Conflict(f"the champion moved from {expected or 'none'} to "
                           f"{current['version'] if current else 'none'} during this run")
        history = ([{k: current[k] for k in ("version", "since", "reason", "by")}] + current.get("history", [])
                   if current else [])
        champion = {"version": name, "since": _now(), "reason": reason, "by": by,
                    "mAP": version.get("metrics", {}).get("mAP"), "saved_model": version.get("saved_model"),
                    "history": history}
        self.store.replace(self._rel(CHAMPION_FILE), _dump(champion), text)
        return champion
