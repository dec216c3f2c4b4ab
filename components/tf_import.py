"""TensorFlow's import without the optional libraries it and Keras load for features detpipe
never uses.

Importing TensorFlow imports Keras, and the two import, each inside `try: import ... except
ImportError`, scikit-learn (with SciPy) for Keras' scikit-learn wrappers, matplotlib.pyplot for
Keras' image-gallery plot, pandas for Keras' DataFrame inputs, and googleapiclient for
TensorFlow's GCE cluster resolver (TPU pods): 1.6-2.0 of the 4.0-4.5 CPU-seconds a process spent
importing the trainer on 2 cores, paid by every step, trial, worker and server
(docs/measurements.md). `install()` (called by the packages' `__init__`) hides those names from
the import system while `tensorflow` or `keras` is being imported, and only then: the libraries
take the ImportError they are written for, and the same names import normally afterwards, where
detpipe uses them (cleanlab's scikit-learn, the evaluation's pictures, TFDV's pandas). The Beam
workers' `skip_imports` (beam/local_worker.py) is another thing: modules a worker never imports at
all.

By hand because it is about this stack's import graph: no library does it. How it knows an
import is in progress: importlib marks a module's spec `_initializing` while the module runs
(what `import` itself reads to tell a half-imported module, importlib/_bootstrap.py). A library
that asked `importlib.util.find_spec` for one of them during that import would get the error, not
None: TensorFlow 2.16 and Keras 3.15 ask it only of keras and tf_keras (checked in their sources).

    >>> install(); install()  # once per process, however often it is called
    >>> sum(isinstance(finder, _HiddenDuringImport) for finder in sys.meta_path)
    1
"""

from __future__ import annotations

import importlib.abc
import sys

# What TensorFlow's and Keras' own imports skip when it is missing.
HIDDEN = ("sklearn", "matplotlib", "googleapiclient", "pandas")
# The imports during which they are hidden.
HIDING = ("tensorflow", "keras")


def _importing(name: str) -> bool:
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


class _HiddenDuringImport(importlib.abc.MetaPathFinder):
    """Raises ModuleNotFoundError for HIDDEN packages while a HIDING module is importing;
    otherwise finds nothing, so the usual finders after it do."""

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in HIDDEN and any(_importing(module) for module in HIDING):
            raise ModuleNotFoundError(f"{name} is not imported while TensorFlow imports (components/tf_import.py)",
                                      name=name)
        return None


def install() -> None:
    """Put the finder first on sys.meta_path, once."""
    if not any(isinstance(finder, _HiddenDuringImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HiddenDuringImport())
