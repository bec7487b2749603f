"""Named presets (functions returning a Config) and defaults that come from measurements.

A preset is a starting point; flags given on the command line still override it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from cnnpar.config import Config, DataConfig, ModelConfig, OptimConfig, RunConfig, SpeedConfig
from cnnpar.errors import ConfigError

# Which models torch.compile helps, by device, from benchmarks/results/h200-2026-11-29 (one H200,
# torch 2.11, bf16, channels_last, cnnpar's Trainer with resident data): ResNet-50 at 224, batch
# 256: 4,660 img/s eager, 6,753 compiled, 6,854 compiled with CUDA graphs; ResNet-18 at 32, batch
# 512: 59,258 eager, 37,872 compiled, 61,730 eager with CUDA graphs, 84,868 compiled with CUDA
# graphs. Compile alone slowed the small-input model (its step is launch-bound and compile adds
# host work per call); with the step captured as a graph the launches are gone and compile's
# fusions pay. CUDA graphs are on by default for one CUDA process (see resolve_for_device), so
# compile is on for both measured models. Models not measured stay eager. On the CPU the compile
# time (tens of seconds) is rarely repaid in a short run.
_COMPILE_HELPS_ON_CUDA = {"resnet18", "resnet50"}


def compile_default(model_name: str, device_type: str) -> str:
    if device_type == "cuda" and model_name in _COMPILE_HELPS_ON_CUDA:
        return "default"
    return "off"


def default() -> Config:
    """`cnnpar train` with no flags: cnn3 on the built-in digits, a short CPU-friendly run."""
    return Config()


def mnist() -> Config:
    return Config(
        data=DataConfig(source="mnist.npz", augment="none"),
        run=RunConfig(epochs=3, batch_size=128),
    )


def cifar10_resnet18() -> Config:
    return Config(
        data=DataConfig(augment="crop+flip"),
        model=ModelConfig(name="resnet18"),
        optim=OptimConfig(optimizer="sgd", lr=0.2, weight_decay=5e-4, label_smoothing=0.1),
        run=RunConfig(epochs=20, batch_size=512),
    )


def cifar10_speed() -> Config:
    """The fast CIFAR-10 recipe for fastnet: the whole uint8 set resident on the GPU, batched
    crop+flip on the device, bf16 and channels_last, a whitened stem (fastnet.init_from_data),
    label smoothing, Nesterov SGD with a short warm-up and linear decay, and test-time flip
    averaging. Point --data at a decoded CIFAR-10 .npz (benchmarks/prepare_cifar10.py)."""
    return Config(
        data=DataConfig(source=".devdata/cifar10.npz", augment="crop+flip", resident="on"),
        model=ModelConfig(name="fastnet"),
        optim=OptimConfig(
            optimizer="sgd",
            lr=0.2,
            momentum=0.85,
            weight_decay=5e-4,
            label_smoothing=0.2,
            warmup=0.1,
            schedule="onecycle",
        ),
        run=RunConfig(epochs=10, batch_size=1024, tta_flip=True, eval_every=10),
    )


def throughput() -> Config:
    """Synthetic data, no validation between epochs: for measuring the train step alone."""
    return Config(
        data=DataConfig(source="synthetic", image_shape="3x224x224", synthetic_samples=8192),
        model=ModelConfig(name="resnet50"),
        speed=SpeedConfig(),
        run=RunConfig(epochs=1, batch_size=256, eval_every=1000),
    )


PRESETS: dict[str, Callable[[], Config]] = {
    "default": default,
    "mnist": mnist,
    "cifar10-resnet18": cifar10_resnet18,
    "cifar10-speed": cifar10_speed,
    "throughput": throughput,
}


def get_preset(name: str) -> Config:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"preset {name!r}: expected one of {', '.join(PRESETS)}") from None


def with_overrides(cfg: Config, **sections: dict) -> Config:
    """`with_overrides(cfg, run={"epochs": 1})` -> a new Config with those fields replaced."""
    return replace(cfg, **{k: replace(getattr(cfg, k), **v) for k, v in sections.items()})
