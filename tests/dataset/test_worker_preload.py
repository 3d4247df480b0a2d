"""Workers start with the heavy modules of their sources already imported (forkserver preload).

The worker server grainlike starts when it is imported preloads what was loaded
by then; a module loaded later gets a server that preloads it, started when
workers need it.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.helpers.processes import run_in_session

SCRIPT = textwrap.dedent(
    """
    import sys
    {first}
    {second}
    from grainlike.workers import server as worker_server, start as worker_start

    if {disable}:
        worker_server.PRELOAD_IF_LOADED = ()
    # The preloaded server's imports are under test: a worker forked from this
    # process (fork_is_safe) has every module it has.
    worker_start.fork_is_safe = lambda: False


    class Probe(gl.MapTransform):
        def map(self, x):
            # Whether the worker had the module before the pipeline reached it.
            return int("{module}" in sys.modules)


    loader = gl.DataLoader(
        data_source=gl.RangeDataSource(0, 4, 1),
        sampler=gl.IndexSampler(4, gl.NoSharding(), shuffle=False, num_epochs=1),
        operations=[Probe()],
        worker_count=2,
    )
    print("RESULT", sorted(int(v) for v in loader))
    """
)


@pytest.mark.parametrize("module", ["tensorflow_datasets", "datasets"])
# (module imported before grainlike, preloading disabled); with the module first,
# the server started at import has it whatever the setting, so no control there.
@pytest.mark.parametrize("module_first, disable", [(True, False), (False, False), (False, True)])
def test_workers_have_the_source_modules_the_parent_loaded(module, disable, module_first):
    pytest.importorskip(module)
    imports = [f"import {module}", "import grainlike as gl"]
    first, second = imports if module_first else imports[::-1]
    proc, out, err = run_in_session(
        [sys.executable, "-c", SCRIPT.format(module=module, disable=disable, first=first, second=second)],
        timeout=90,
    )
    assert proc.returncode == 0, err
    line = [l for l in out.splitlines() if l.startswith("RESULT")][-1]
    assert line == ("RESULT [0, 0, 0, 0]" if disable else "RESULT [1, 1, 1, 1]")
