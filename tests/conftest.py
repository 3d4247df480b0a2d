"""Shared test set-up."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Tests run JAX on the CPU, one device per process.
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _default_signal_handling() -> None:
    """SIGINT raises KeyboardInterrupt and SIGHUP ends a process, in the suite and its children.

    A suite started in the background of a script (``cmd &``, which ignores SIGINT)
    or under ``nohup`` (which ignores SIGHUP) would otherwise pass those ignored
    dispositions to every process it starts, and the tests that send these
    signals would test nothing.
    """
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


_default_signal_handling()


def _start_accelerator() -> None:
    """On a GPU host, starts JAX's backends (and a host callback) before any test.

    CUDA opens descriptors and threads of its own at first use; started here,
    they are part of every leak check's snapshot instead of counting as leaks
    of the first test that touches JAX.
    """
    if set(os.environ["JAX_PLATFORMS"].split(",")) <= {"cpu", ""}:
        return
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.devices()
    jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.ones(2)))
    if "cpu" in os.environ["JAX_PLATFORMS"].split(","):
        # Host callbacks run on JAX's cpu platform: start it too.
        call = lambda x: jax.pure_callback(np.negative, jax.ShapeDtypeStruct((2,), jnp.float32), x)  # noqa: E731
        jax.block_until_ready(jax.jit(call)(jnp.ones(2)))


_start_accelerator()

from tests.helpers.callbacks import callbacks_never_raise  # noqa: E402,F401  (a fixture)
from tests.helpers.leaks import no_leaks  # noqa: E402,F401  (a fixture for every test)


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_earlier_modules_made():
    """Puts every object alive when a test module starts out of the cyclic garbage collector's reach.

    The libraries the tests import (JAX, TensorFlow, Ray, Orbax, grain) and what
    earlier modules cached come to a million objects or more in a long run, and a
    full collection walks every one: the leak check's after each test took a
    second or more, as did the interpreter's own full collections, in the tests
    and in their forked children (which copy each page a collection touches).
    Frozen objects are still freed by reference counting; what the module's
    tests make is collected as before.
    """
    import gc

    gc.collect()
    gc.freeze()
    yield


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (tools/test) with the longest files first and grain's own tests last."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.helpers.scheduling import LongestFirst

    return LongestFirst(config, log)


# grain's own tests run in the background (tests/grain_suite); these hooks start,
# report and end that run, in the process that prints the summary: pytest's
# only process, or the pytest-xdist controller.
def _grain_suite():
    from tests.grain_suite import test_grain_own_tests

    return test_grain_own_tests


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["grain_suite_work"] = _grain_suite().share_with_workers()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    suite = _grain_suite()
    files = suite.files_of(ids)
    if files:
        suite.start_files(files, suite.share_with_workers())


def pytest_unconfigure(config):
    # After the terminal summary, which reads the run's folder.
    if not hasattr(config, "workerinput"):
        _grain_suite().stop()


def pytest_terminal_summary(terminalreporter):
    line = _grain_suite().summary()
    if line:
        terminalreporter.write_line(line)
