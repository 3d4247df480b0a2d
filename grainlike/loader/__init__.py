"""The DataLoader, its iterator and state, composed of the Dataset API's stages.

The package is also callable (set up by ``grainlike``'s ``__init__``):
``grainlike.loader(source)`` starts the notebook builder (``grainlike.from_source``),
e.g. ``grainlike.loader(source).shuffle(0).map(f).batch(128).workers(2).build()``.
"""
