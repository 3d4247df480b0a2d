"""Retries of remote operations (``with_retries``), and which failures are worth one.

A failure is recognised by its exception class names (anywhere in the MRO), HTTP
status and text, as botocore, aiohttp, requests, google-cloud and fsspec raise them.
"""

from __future__ import annotations

import re
import time
from typing import Callable, Optional, TypeVar

from grainlike.core.errors import ObjectChangedError, RemoteAccessError, RemoteReadError
from grainlike.sources.formats.remote_options import RemoteOptions

__all__ = ["error_names", "http_status", "with_retries"]

T = TypeVar("T")

# Lost or refused connections, timeouts, throttling and unavailable services.
_TRANSIENT_NAME = re.compile(
    r"Connection|Timeout|Throttl|SlowDown|ServiceUnavailable|TooManyRequests|"
    r"ServerDisconnected|IncompleteRead|ResponseStreamingError|ProtocolError|"
    r"Payload|ContentLength"
)
_TRANSIENT_TEXT = re.compile(
    r"SlowDown|Throttl|Too Many Requests|\b503\b|\b429\b|\b500\b|ServiceUnavailable|"
    r"RequestTimeout|Connection (reset|refused|aborted)|Could not connect"
)
_CREDENTIALS_NAME = re.compile(r"Credential|Unauthenticated|Forbidden|AccessDenied|RefreshError")


def error_names(e: BaseException) -> str:
    return " ".join(c.__name__ for c in type(e).__mro__)


def _is_credentials_error(e: BaseException) -> bool:
    if isinstance(e, PermissionError) or _CREDENTIALS_NAME.search(error_names(e)):
        return True
    # gcsfs raises a refusal as a plain OSError("Forbidden: ...") (403) or an
    # HttpError carrying the status (401), with no telling class name.
    return getattr(e, "code", None) in (401, 403) or str(e).startswith("Forbidden:")


def http_status(e: Optional[BaseException]) -> Optional[int]:
    """The HTTP status behind a store's exception or its causes, if one says it."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict):  # botocore's ClientError (s3fs keeps it as the cause)
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        for attr in ("code", "status"):  # gcsfs's HttpError, aiohttp's ClientResponseError
            status = getattr(e, attr, None)
            if isinstance(status, int) and 100 <= status < 600:
                return status
        e = e.__cause__ or e.__context__
    return None


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError, ObjectChangedError)):
        return False
    if isinstance(e, (ConnectionError, TimeoutError)):
        return True
    status = http_status(e)
    # 5xx: the store failed (s3fs turns S3's 500 "InternalError" into a bare OSError
    # whose text says no status); 408/429: timed out or throttled.
    if status is not None and (status >= 500 or status in (408, 429)):
        return True
    return bool(_TRANSIENT_NAME.search(error_names(e)) or _TRANSIENT_TEXT.search(str(e)))


def with_retries(fn: Callable[[], T], url: str, what: str, options: RemoteOptions) -> T:
    """Returns ``fn()``, retrying transient failures with exponential backoff.

    Args:
      fn: the remote operation (no arguments).
      url: the object it touches, named in errors.
      what: what it does ("read bytes 0-4096 of", "list"), named in errors.
      options: attempts and backoff.

    Raises:
      FileNotFoundError: the object does not exist.
      RemoteAccessError: credentials are missing or refused.
      RemoteReadError: still failing after ``options.attempts`` tries.
    """
    delay = options.backoff_s
    for attempt in range(1, options.attempts + 1):
        try:
            return fn()
        except FileNotFoundError as e:
            raise FileNotFoundError(f"{url!r}: no such object ({what}): {e}") from e
        except ObjectChangedError:
            raise
        except Exception as e:  # pylint: disable=broad-except
            if _is_credentials_error(e) and not _is_transient(e):
                raise RemoteAccessError(
                    f"{url!r}: access denied or no credentials ({what}): {type(e).__name__}: {e}. "
                    "Set the store's credentials (for s3://: AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY or a profile; for gs://: "
                    "GOOGLE_APPLICATION_CREDENTIALS), or pass them in "
                    "RemoteOptions(storage_options=...)."
                ) from e
            if not _is_transient(e):
                raise
            if attempt == options.attempts:
                status = http_status(e)
                answer = f" (the store answered HTTP {status})" if status is not None else ""
                raise RemoteReadError(
                    f"{url!r}: failed to {what} after {attempt} attempts{answer}: "
                    f"{type(e).__name__}: {e}. Tries, backoff and the request timeout are "
                    f"RemoteOptions.attempts (now {options.attempts}), .backoff_s and .timeout_s "
                    f"(now {options.timeout_s:g} s).",
                    url,
                    status,
                    attempt,
                ) from e
            time.sleep(delay)
            delay = min(delay * 2, options.max_backoff_s)
    raise AssertionError("unreachable")
