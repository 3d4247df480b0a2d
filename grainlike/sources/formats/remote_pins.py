"""Version pins of remote objects, as sources check them and iterator states carry them.

A pin is an ``object_info`` (``remote_files``): the size and version (ETag, S3
VersionId, GCS generation, MD5) of an object when a source first opened it.
"""

from __future__ import annotations

from typing import Any

from grainlike.core.errors import InvalidStateError, ObjectChangedError

__all__ = ["check_pin", "pin_from_state", "pin_state", "pins_from_state", "same_version", "saved_version_gone"]


def check_pin(url: str, pin: dict, info: dict) -> None:
    """Raises ``ObjectChangedError`` if ``info`` is not the version ``pin`` recorded."""
    if (info["version"], info["size"]) != (pin["version"], pin["size"]):
        raise ObjectChangedError(
            url, f"{pin['version']} ({pin['size']} bytes)", f"{info['version']} ({info['size']} bytes)"
        )


def pin_state(pin: dict) -> dict:
    """A pin as iterator states carry it: its known fields only (JSON-able)."""
    return {k: v for k, v in pin.items() if v is not None}


def pin_from_state(url: str, saved: Any) -> dict:
    """The pin (an ``object_info``) a state recorded for ``url``.

    Raises:
      InvalidStateError: ``saved`` is not a pin (a dict with ``size`` and ``version``).
    """
    try:
        if not isinstance(saved, dict):
            raise TypeError
        pin = {"size": int(saved["size"]), "version": str(saved["version"])}
    except (KeyError, TypeError, ValueError, OverflowError):
        raise InvalidStateError(
            f"the state's version of {url!r} must be a dict naming the object's size and "
            f"version (as get_state() writes it), got {saved!r}"
        ) from None
    for key in ("etag", "version_id", "generation", "md5"):
        value = saved.get(key)
        pin[key] = None if value is None else str(value)
    return pin


def pins_from_state(current: dict, saved: Any, source: str) -> dict:
    """A state's ``{url: pin}`` (``saved``), checked to name the remote objects ``source`` pins (``current``).

    Raises:
      InvalidStateError: ``saved`` is not such a dict, or names other objects.
    """
    if not isinstance(saved, dict) or sorted(saved) != sorted(current):
        named = sorted(saved) if isinstance(saved, dict) else saved
        raise InvalidStateError(
            f"the state's remote object versions name {named!r}, but {source} reads {sorted(current)}"
        )
    return {url: pin_from_state(url, pin) for url, pin in saved.items()}


def same_version(a: dict, b: dict) -> bool:
    """Whether two pins name the same contents: the same version, or the same size and MD5.

    A GCS object uploaded again with the same bytes (restored from a backup) has
    a new generation but the same MD5; an S3 object's ETag is its MD5 already.
    """
    if int(a["size"]) != int(b["size"]):
        return False
    return str(a["version"]) == str(b["version"]) or (a.get("md5") is not None and a.get("md5") == b.get("md5"))


def saved_version_gone(url: str, saved: dict, current: dict) -> ObjectChangedError:
    """The error of a restore whose saved version of ``url`` the store no longer has."""
    error = ObjectChangedError(
        url, f"{saved['version']} ({saved['size']} bytes)", f"{current['version']} ({current['size']} bytes)"
    )
    error.add_note(
        f"The state being restored was saved while reading version {saved['version']} of "
        f"{url!r}; the object has been overwritten since and the store does not keep that "
        "version (an S3 bucket with versioning or GCS generations would). Restore onto the "
        "data the checkpoint was taken on, or start the epoch again."
    )
    return error
