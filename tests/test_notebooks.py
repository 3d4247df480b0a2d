"""Every notebook runs from top to bottom, and its two forms say the same thing.

Notebooks are kept as jupytext pairs: ``name.md`` (what is edited and reviewed)
and ``name.ipynb`` (what Jupyter opens). The three notebooks are executed at the
same time, each in its own kernel: most of their time is spent starting kernels
and processes and importing libraries, which overlaps well even on two cores.
"""

from __future__ import annotations

import concurrent.futures
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
NAMES = [os.path.basename(p)[: -len(".ipynb")] for p in NOTEBOOKS]
# Per cell; a whole notebook is meant to take well under a minute.
CELL_TIMEOUT_S = 120


def _execute(path: str, workdir: str) -> object:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": workdir}},
    )
    client.execute()
    return nb


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Starts every notebook at once; maps name -> future of the executed notebook."""
    pytest.importorskip("nbclient", reason="nbclient is in the dev extra")
    pytest.importorskip("ipykernel", reason="ipykernel is in the dev extra")
    # The kernels import grainlike from this checkout, installed or not, and run
    # JAX on the CPU like the rest of the suite.
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
        "MPLBACKEND": "Agg",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(NOTEBOOKS) or 1)
    try:
        futures = {
            name: pool.submit(_execute, path, str(tmp_path_factory.mktemp(name)))
            for name, path in zip(NAMES, NOTEBOOKS)
        }
        yield futures
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_there_are_notebooks():
    assert {"dataloader_guide", "train_mnist_jax", "migrating"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(executed, name):
    try:
        nb = executed[name].result(timeout=600)
    except Exception as e:
        # nbclient's CellExecutionError carries the failing cell and its traceback.
        pytest.fail(f"notebooks/{name}.ipynb failed:\n{e}", pytrace=False)
    errors = [
        o for c in nb.cells if c.cell_type == "code"
        for o in c.get("outputs", []) if o.get("output_type") == "error"
    ]
    assert not errors


@pytest.mark.parametrize("name", NAMES)
def test_notebook_pair_in_sync(name):
    jupytext = pytest.importorskip("jupytext", reason="jupytext is in the dev extra")
    import nbformat

    base = os.path.join(ROOT, "notebooks", name)
    assert os.path.exists(base + ".md"), f"notebooks/{name}.ipynb has no paired .md"
    text = jupytext.read(base + ".md")
    nb = nbformat.read(base + ".ipynb", as_version=4)

    def cells(notebook):
        return [(c.cell_type, c.source.strip()) for c in notebook.cells]

    assert cells(text) == cells(nb), (
        f"notebooks/{name}.md and .ipynb differ; run "
        f"`jupytext --sync notebooks/{name}.md`"
    )
