"""Small inputs for the conversion tools, written on the fly."""

import numpy as np
import pytest

# Class -> image sizes (height, width); the images differ in size, as real ones do.
CLASSES = {"cat": [(10, 12), (9, 14), (12, 12), (11, 10), (10, 10)], "dog": [(8, 16), (13, 9), (10, 11), (12, 15)]}


@pytest.fixture
def image_dir(tmp_path):
    """``tmp/images/{cat,dog}/NNN.png``: 5 cats and 4 dogs; pixel value = 10 * file number."""
    cv2 = pytest.importorskip("cv2")
    root = tmp_path / "images"
    for name, sizes in CLASSES.items():
        (root / name).mkdir(parents=True)
        for i, (h, w) in enumerate(sizes):
            assert cv2.imwrite(str(root / name / f"{i:03d}.png"), np.full((h, w, 3), 10 * i, np.uint8))
    (root / "dog" / "notes.txt").write_text("not an image, and ignored")
    (root / "empty_class").mkdir()  # no images: not a class
    return root
