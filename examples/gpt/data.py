"""A real text corpus that every machine has offline: the documentation strings of a fixed
list of Python standard-library modules, as bytes (vocabulary of 256).

The text depends only on the Python version, so every rank builds the same corpus; batches
are drawn with a seeded NumPy generator, identical on every rank, and each rank keeps only
its shard once the batch becomes a global tensor.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import warnings

import numpy as np

MODULES = [
    "abc", "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy",
    "csv", "dataclasses", "datetime", "decimal", "difflib", "enum", "fnmatch", "fractions",
    "functools", "glob", "gzip", "hashlib", "heapq", "html", "inspect", "io", "itertools",
    "json", "logging", "math", "operator", "os", "pathlib", "pickle", "pprint", "queue",
    "random", "re", "shutil", "socket", "sqlite3", "statistics", "string", "struct",
    "subprocess", "tempfile", "textwrap", "threading", "typing", "unittest", "urllib.parse",
    "uuid", "zipfile",
]
VOCAB_SIZE = 256


@functools.lru_cache(maxsize=1)
def corpus_text() -> str:
    """Module and public-member docstrings, in a fixed order."""
    with warnings.catch_warnings():  # some members are deprecated aliases (typing.io)
        warnings.simplefilter("ignore")
        return _collect()


def _collect() -> str:
    parts = []
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # a trimmed Python build: skip what is missing, on every rank
            continue
        doc = inspect.getdoc(mod)
        if doc:
            parts.append(f"# {name}\n{doc}\n")
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
                d = inspect.getdoc(obj)
                if d and getattr(obj, "__module__", name) == name:
                    parts.append(f"## {name}.{attr}\n{d}\n")
    return "\n".join(parts)


class Corpus:
    """Byte-level train/validation split of :func:`corpus_text`."""

    def __init__(self, val_fraction: float = 0.1):
        data = np.frombuffer(corpus_text().encode("utf-8"), dtype=np.uint8).astype(np.int64)
        cut = int(len(data) * (1 - val_fraction))
        self.train, self.val = data[:cut], data[cut:]

    def batch(self, rng: np.random.Generator, batch_size: int, seq_len: int,
              split: str = "train"):
        """``(inputs, targets)`` of shape (batch_size, seq_len): targets are inputs shifted
        by one byte."""
        data = self.train if split == "train" else self.val
        starts = rng.integers(0, len(data) - seq_len - 1, size=batch_size)
        idx = starts[:, None] + np.arange(seq_len)[None, :]
        return data[idx], data[idx + 1]

    def __len__(self) -> int:
        return len(self.train) + len(self.val)
