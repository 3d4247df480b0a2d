"""``loadax.dataloader``: the builder and the loaders."""

from grainlike.compat.loadax.dataloader.builder import DataloaderBuilder as DataloaderBuilder
from grainlike.compat.loadax.dataloader.loader import Dataloader as Dataloader
from grainlike.compat.loadax.dataloader.naive import NaiveDataloader as NaiveDataloader
