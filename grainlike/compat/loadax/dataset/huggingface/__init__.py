"""``loadax.dataset.huggingface``: Hugging Face datasets (the ``datasets`` package)."""

from grainlike.compat.loadax.dataset.huggingface.dataset import HuggingFaceDataset as HuggingFaceDataset
