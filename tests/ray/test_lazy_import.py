"""``import grainlike.ray`` costs no Ray: ``ray`` is imported when workers start."""

from __future__ import annotations

import subprocess
import sys


def test_importing_grainlike_ray_does_not_import_ray():
    code = (
        "import sys, grainlike, grainlike.ray as r; "
        "r.prefetch(grainlike.MapDataset.range(4).to_iter_dataset(), 2); "
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
