"""Faces with other JAX data libraries' names over grainlike's features.

Each subpackage lets code written for one of those libraries run with only its
imports changed (``grainlike.compat.jax_sgmc`` for JaxSGMC,
``grainlike.compat.loadax`` for Loadax). ``import grainlike``
does not import this package.
"""
