"""docs/dataset.md's table of names covers grain 0.2.18's Dataset API, and only names grainlike has.

(The page's code blocks run in ``tests/test_docs.py``.)
"""

from __future__ import annotations

import abc
import os
import re

import grainlike
from tests.compat.conftest import grain_ref  # noqa: F401 (the fixture)
from tests.test_docs import DOCS

# The table's sections (its bold rows), and the grainlike object each one's names live on.
SECTIONS = {
    "factories": None,
    "`MapDataset` methods": grainlike.MapDataset,
    "`IterDataset` methods": grainlike.IterDataset,
    "`DatasetIterator` methods": grainlike.DatasetIterator,
    "`grain.experimental`": grainlike.experimental,
    "options and transforms": grainlike,
}


def _table_sections() -> dict:
    """Section name -> the first-column cells of its rows, from the "Every name" table."""
    text = open(os.path.join(DOCS, "dataset.md")).read()
    table = text.split("## Every name", 1)[1].split("\n## ", 1)[0]
    sections: dict = {}
    current = None
    for line in table.splitlines():
        if not line.startswith("| ") or line.startswith("|---") or line.startswith("| name "):
            continue
        first = line.split("|")[1].strip()
        bold = re.fullmatch(r"\*\*(.+)\*\*", first)
        if bold:
            current = bold.group(1)
            sections[current] = []
        else:
            assert current is not None, f"a row before the first section: {line}"
            sections[current].append(first)
    return sections


def _public(cls) -> set:
    """A class's public names, less those every ABC has (``register``)."""
    return {n for n in dir(cls) if not n.startswith("_") and not hasattr(abc.ABC, n)}


def _factories(cls) -> set:
    """The class-level factories grain defines on the Dataset classes' metaclasses."""
    meta = type(cls)
    if meta is abc.ABCMeta:
        return set()
    return {n for n in vars(meta) if not n.startswith("_")}


def _mentions(cells: list, name: str) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(name)}\b|\.{re.escape(name)}\b", c) for c in cells)


def test_table_has_its_sections():
    assert list(_table_sections()) == list(SECTIONS)


def test_table_names_every_method_and_factory_of_grains_dataset_classes(grain_ref):
    sections = _table_sections()
    expected = {
        "factories": {
            f"{cls.__name__}.{name}"
            for cls in (grain_ref.MapDataset, grain_ref.IterDataset)
            for name in _factories(cls)
        },
        "`MapDataset` methods": _public(grain_ref.MapDataset),
        "`IterDataset` methods": _public(grain_ref.IterDataset),
        "`DatasetIterator` methods": _public(grain_ref.DatasetIterator),
    }
    assert expected["factories"] and expected["`DatasetIterator` methods"]
    missing = {
        section: sorted(n for n in names if not _mentions(sections[section], n))
        for section, names in expected.items()
    }
    assert not any(missing.values()), f"grain names missing from docs/dataset.md's table: {missing}"


def test_every_name_in_the_table_exists_in_grainlike_and_in_grain(grain_ref):
    sections = _table_sections()
    absent = []
    for section, cells in sections.items():
        owner = SECTIONS[section]
        text = " ".join(cells)
        if section == "factories":
            pairs = re.findall(r"`(MapDataset|IterDataset)\.(\w+)\(", text)
            for cls_name, name in pairs:
                for lib in (grainlike, grain_ref):
                    if not hasattr(getattr(lib, cls_name), name):
                        absent.append(f"{lib.__name__}.{cls_name}.{name}")
        elif owner in (grainlike.MapDataset, grainlike.IterDataset, grainlike.DatasetIterator):
            grain_cls = getattr(grain_ref, owner.__name__)
            for name in set(re.findall(r"\b(?:ds|it)\.(\w+)", text)):
                for cls in (owner, grain_cls):
                    if not hasattr(cls, name):
                        absent.append(f"{cls.__module__}.{cls.__name__}.{name}")
        else:
            grain_module = grain_ref.experimental if owner is grainlike.experimental else grain_ref
            names = set(re.findall(r"`([A-Za-z_]\w*)\(", text)) | set(re.findall(r"`([A-Z]\w*)`", text))
            assert names, section
            for name in names:
                for module in (owner, grain_module):
                    if not hasattr(module, name):
                        absent.append(f"{module.__name__}.{name}")
    assert not absent, f"docs/dataset.md's table names what does not exist: {absent}"

