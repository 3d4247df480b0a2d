"""docs/migrating.md lists every grain test grainlike does not pass, with the reason."""

import os

from tests.grain_suite.exclusions import EXCLUDED, NOT_RUN

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "migrating.md")


def rows() -> list[str]:
    """The table rows docs/migrating.md must hold, one per exclusion."""
    return [f"| `{pattern}` | {reason} |" for pattern, reason in {**EXCLUDED, **NOT_RUN}.items()]


def test_migrating_lists_every_excluded_grain_test_with_its_reason():
    with open(DOC) as f:
        text = f.read()
    missing = [row for row in rows() if row not in text]
    assert not missing, "add these rows to docs/migrating.md (grain's own unit tests):\n" + "\n".join(missing)
