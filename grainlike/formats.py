"""The record format written by ``grainlike-convert``: defined in ``grainlike.sources.formats.record_codec``."""

from grainlike.sources.formats import record_codec as _codec
from grainlike.sources.formats.record_codec import *  # noqa: F401,F403

__all__ = _codec.__all__
