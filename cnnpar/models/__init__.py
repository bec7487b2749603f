"""Models by name: `build_model(name, in_channels, num_classes, image_size)`."""

from cnnpar.models.registry import MODELS, build_model, describe_models

__all__ = ["MODELS", "build_model", "describe_models"]
