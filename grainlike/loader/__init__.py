"""The DataLoader, its iterator and state, and worker processes.

The package is also callable: ``grainlike.loader(source)`` starts the notebook
builder (``grainlike.from_source``), e.g.
``grainlike.loader(source).shuffle(0).map(f).batch(128).workers(2).build()``.
``grainlike.builder``, which sits above this package, makes it callable.
"""
