"""``grain._src.core.tree_lib``: grain's private path, re-exported from grainlike."""

from grainlike.core import tree_lib as _tree_lib
from grainlike.core.tree_lib import *  # noqa: F401,F403

__all__ = _tree_lib.__all__
