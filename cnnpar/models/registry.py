"""The model registry: name -> builder and a one-line description for `cnnpar models`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.nn as nn

from cnnpar.errors import ConfigError


@dataclass(frozen=True)
class ModelEntry:
    build: Callable[[int, int, int], nn.Module]  # (in_channels, num_classes, image_size) -> model
    description: str


MODELS: dict[str, ModelEntry] = {}


def register(name: str, description: str):
    def deco(fn):
        MODELS[name] = ModelEntry(fn, description)
        return fn

    return deco


def build_model(name: str, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    _load_builtin()
    if name not in MODELS:
        raise ConfigError(f"model {name!r}: expected one of {', '.join(sorted(MODELS))} (see `cnnpar models`)")
    return MODELS[name].build(in_channels, num_classes, image_size)


def describe_models() -> list[tuple[str, str]]:
    _load_builtin()
    return [(n, MODELS[n].description) for n in sorted(MODELS)]


def _load_builtin() -> None:
    # Imported for their @register side effect; kept lazy so `import cnnpar.models` stays cheap.
    from cnnpar.models import cnn3, fastnet, resnet  # noqa: F401
