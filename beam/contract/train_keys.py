"""`train_keys.txt`: the train split's images, by the sha256 of the bytes written (the
records' `image/key/sha256`), one per line, sorted and unique. The data step writes it
beside the shards; training keeps a copy with the model and the registry with each
version, so a warm start can tell how much of its train split the model it continues
has not seen (components/train/warm_start.py). One definition for the writer and readers.

>>> new_share({"a", "b", "c", "d"}, {"a", "b", "c", "x"}), new_share({"a"}, None), new_share(set(), {"a"})
(0.25, None, None)
"""

from __future__ import annotations

from collections.abc import Iterable

TRAIN_KEYS_FILE = "train_keys.txt"


def write_train_keys(folder: str, keys: Iterable[str]) -> str:
    """Write FOLDER/train_keys.txt (local or gs://); returns its path."""
    from apache_beam.io.filesystems import FileSystems  # here: the CLI's checks import this module without Beam

    path = FileSystems.join(folder, TRAIN_KEYS_FILE)
    with FileSystems.create(path) as handle:
        handle.write("".join(f"{key}\n" for key in sorted(set(keys))).encode())
    return path


def read_train_keys(folder: str) -> frozenset[str] | None:
    """The keys in FOLDER/train_keys.txt; None when there is no such file (a dataset or
    model made before it was written)."""
    from apache_beam.io.filesystems import FileSystems

    path = FileSystems.join(folder, TRAIN_KEYS_FILE)
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as handle:
        return frozenset(line for line in handle.read().decode().splitlines() if line)


def copy_train_keys(source: str, target: str) -> bool:
    """Copy SOURCE/train_keys.txt into the folder TARGET as it is (local or gs://); False when
    SOURCE has none."""
    from apache_beam.io.filesystems import FileSystems

    path = FileSystems.join(source, TRAIN_KEYS_FILE)
    if not FileSystems.exists(path):
        return False
    FileSystems.copy([path], [FileSystems.join(target, TRAIN_KEYS_FILE)])
    return True


def new_share(train: frozenset[str] | set[str] | None, seen: frozenset[str] | set[str] | None) -> float | None:
    """The share of `train` (this run's train images) not in `seen` (the train images of the
    model it continues); None when either is unknown or `train` is empty."""
    if not train or seen is None:
        return None
    return len(set(train) - set(seen)) / len(train)
