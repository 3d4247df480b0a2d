"""docs/architecture.md matches the code: the modules it names exist, and it names
every package of the import-linter layers contract in pyproject.toml."""

import importlib.util
import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def _named_modules() -> set[str]:
    names = set(re.findall(r"\bgrainlike(?:\.[A-Za-z_]\w*)*", DOC))
    # ``grainlike.experimental, .checkpoint, ...``: the short forms after a full name.
    for line in DOC.splitlines():
        full = re.search(r"\b(grainlike)\.\w+", line)
        if full:
            names.update(f"grainlike.{short}" for short in re.findall(r"(?<![\w.])\.([A-Za-z_]\w*)", line))
    return names


def test_every_module_the_page_names_exists():
    missing = sorted(n for n in _named_modules() if importlib.util.find_spec(n) is None)
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_the_page_names_every_package_of_the_layers_contract():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers" and "containers" not in c)
    packages = {m.strip() for layer in layers["layers"] for m in re.split(r"[:|]", layer)}
    named = _named_modules()
    assert packages - named == set(), f"layers of pyproject.toml missing from docs/architecture.md: {packages - named}"
