"""Which Ray cluster the workers run on: the one given, the one running, or a local one on loopback.

``connect(address)`` is what ``grainlike.ray.prefetch`` calls before it starts
its actors. ``init_local`` starts Ray on this machine bound to 127.0.0.1, with
no dashboard: nothing of it listens on an address another host can reach.

Ray resolves a node address of ``127.0.0.1`` to the machine's outward address
(so that other nodes could join) unless its single-machine mode is on; every
process of a local cluster (GCS, raylet, object manager, workers) then listens
on ``0.0.0.0`` or that address. ``loopback()`` turns that mode on while Ray
starts, so that the processes listen on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import warnings
from typing import Any, Iterator, Optional

# Ray's switch for its single-machine mode (read when ray is imported and by
# the processes it starts); the mode keeps a node on the loopback address.
_SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOOPBACK = "127.0.0.1"


def import_ray() -> Any:
    """``ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "grainlike.ray runs workers on a Ray cluster and needs Ray: pip install 'grainlike[ray]' "
            "(or pip install 'ray>=2.50')"
        ) from e
    return ray


@contextlib.contextmanager
def loopback() -> Iterator[None]:
    """While in the block, Ray nodes started in this process bind to 127.0.0.1 only.

    For ``ray.init(_node_ip_address="127.0.0.1")`` and for
    ``ray.cluster_utils.Cluster``'s nodes (tests): without it Ray replaces the
    loopback address by the machine's outward one and its processes listen on
    every interface.
    """
    import_ray()
    from ray._private import ray_constants

    saved_env = os.environ.get(_SINGLE_MACHINE_ENV)
    saved = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_SINGLE_MACHINE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if saved_env is None:
            os.environ.pop(_SINGLE_MACHINE_ENV, None)
        else:
            os.environ[_SINGLE_MACHINE_ENV] = saved_env
        if saved is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address) is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def init_local(**kwargs: Any) -> Any:
    """Starts a Ray instance on this machine that only this machine can reach.

    ``ray.init(address="local", include_dashboard=False,
    _node_ip_address="127.0.0.1", **kwargs)`` with Ray's processes bound to
    127.0.0.1 (see ``loopback``). Ray's token authentication stays as Ray sets
    it (Ray 2.60 turns it on for a local instance unless ``RAY_AUTH_MODE`` says
    otherwise).

    Args:
      **kwargs: more arguments of ``ray.init`` (``num_cpus``,
        ``object_store_memory``, ``runtime_env``, ...).

    Returns:
      What ``ray.init`` returns (its context).

    Raises:
      RuntimeError: Ray is already initialised in this process.
    """
    ray = import_ray()
    if ray.is_initialized():
        raise RuntimeError(
            "Ray is already initialised in this process; grainlike.ray uses the running "
            "instance as it is (call ray.shutdown() first to start a local one)"
        )
    args = {"address": "local", "include_dashboard": False, "_node_ip_address": LOOPBACK, **kwargs}
    with loopback():
        context = ray.init(**args)
    node_ip = ray.util.get_node_ip_address()
    if not is_loopback(node_ip):
        warnings.warn(
            f"the local Ray instance runs on {node_ip}, not on the loopback address: "
            "other hosts may reach its ports. See docs/security.md (Ray).",
            RuntimeWarning,
            stacklevel=2,
        )
    return context


def connect(address: Optional[str]) -> Any:
    """``ray``, connected: to the instance running in this process, to ``address``, or to a new local one.

    * Ray already initialised in this process (``ray.init`` called by the
      user): used as it is, whatever ``address`` says.
    * ``address`` given (``"ray://host:10001"``, ``"host:6379"``, ``"auto"``),
      or the ``RAY_ADDRESS`` variable set: ``ray.init(address=...)``.
    * Neither: ``init_local()`` (loopback only, no dashboard), which stays up
      until ``ray.shutdown()`` or the end of the process.
    """
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if address is not None:
        ray.init(address=address)
    elif os.environ.get("RAY_ADDRESS"):
        ray.init()
    else:
        init_local()
    return ray
