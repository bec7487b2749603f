"""Named presets (functions returning a Config) and defaults that come from measurements.

A preset is a starting point; flags given on the command line still override it. A preset's lr is the lr at
its own batch (`optim.lr_batch`), so `--batch-size auto` scales it from that batch, not from 64. It is tuned for the
preset's optimizer: another `--optimizer` (typed or a --config file's) with no lr asked for trains at its own default
(--lr auto) at that batch instead (cliargs.preset_lr_set_aside).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from cnnpar.config import LONG_RUN_IMAGES, Config, DataConfig, ModelConfig, OptimConfig, RunConfig, SpeedConfig
from cnnpar.errors import ConfigError

# The long compiles (--compile-tiling and --compile-tuning together) by the length of the run. Measured for
# ResNet-50 224 on one H200 (benchmarks/results/2026-12-01-h200/call-zzo to call-zzq, batch 512, data on the
# GPU): 7,857 and 7,864 img/s against the defaults' 7,219 and 7,250 (1.085-1.088x), tiling alone 1.062x (and
# 1.057x at b256, call-zzk). The pair's compile took 347 s against the defaults' 66 s cold; part of it may have
# come from the previous call's cache, so the rule allows for up to 423 s more than the defaults' compile (ZZO's
# cold tiling compile, 208 s, was 142 s over the defaults': 347 + 142 - 66).
# The faster step saves 1/7,219 - 1/7,857 s an image, so 423 s are repaid after ~38 million images a process:
# on from 40 million. ResNet-18 is left out: its tiling gained 0.4 % and its tuning 2-4 % (a step already near
# 100,000 img/s, where 40 million images take minutes); other models were not measured.
_LONG_COMPILES_PAY_ON_CUDA = {"resnet50"}  # (LONG_RUN_IMAGES, the 40 million: config.py, for --help)


def long_compiles_default(model_name: str, device_type: str, compile_mode: str, images: int) -> tuple[bool, str]:
    """Whether `compile_tiling` and `compile_tuning` at "auto" turn on, and why (a printed line's reason).

    `images`: what one process will train on (epochs x its batches x the batch size)."""
    if device_type != "cuda":
        return False, "auto: measured on CUDA only"
    if compile_mode not in ("default", "reduce-overhead"):
        return False, f"auto: compile {compile_mode}; the rule is for default and reduce-overhead"
    if model_name not in _LONG_COMPILES_PAY_ON_CUDA:
        return False, f"auto: measured to pay for {', '.join(sorted(_LONG_COMPILES_PAY_ON_CUDA))} only"
    planned = f"{images:,} images a process"
    if images < LONG_RUN_IMAGES:
        return False, (
            f"auto: {planned}, under the {LONG_RUN_IMAGES:,} from which ResNet-50's 1.085x faster step on an H200 "
            "repays up to ~7 minutes more of compile"
        )
    return True, (
        f"auto: {planned}, at least {LONG_RUN_IMAGES:,}: ResNet-50's step ran 1.085-1.088x as fast on an H200 "
        "for up to ~7 minutes more of compile"
    )


# The arrays, not only the script: an installed cnnpar (pip install of the wheel) has no benchmarks/ folder
CIFAR10_NPZ = (
    "a decoded CIFAR-10 .npz: x_train uint8 (50000, 32, 32, 3), y_train, x_test uint8 (10000, 32, 32, 3), y_test, "
    "as a cnnpar source checkout's benchmarks/prepare_cifar10.py writes it"
)
# what each preset's default --data path is expected to hold, for the error where that path is missing
PRESET_DATA = {
    "mnist": "an MNIST .npz with x_train and y_train",
    "cifar10-resnet18": CIFAR10_NPZ,
    "cifar10-speed": CIFAR10_NPZ,
    "cifar10-record": CIFAR10_NPZ,
}


def preset_data_note(preset: str, message: str) -> str:
    """For an error `message` about a preset's own --data (not typed): where that path does not exist, which preset
    it came from and what to pass instead (relative paths are the presets' defaults for a checkout's folder); ""
    otherwise."""
    source = get_preset(preset).data.source if preset in PRESETS else ""
    if preset not in PRESET_DATA or source not in message or Path(source).exists():
        return ""
    return f"(the --data of --preset {preset}: pass --data FILE, {PRESET_DATA[preset]})"


def default() -> Config:
    """`cnnpar train` with no flags: cnn3 on the built-in digits, a short CPU-friendly run."""
    return Config()


def mnist() -> Config:
    return Config(
        data=DataConfig(source="mnist.npz", augment="none"),
        optim=OptimConfig(lr_batch=128),
        run=RunConfig(epochs=3, batch_size=128),
    )


def cifar10_resnet18() -> Config:
    # its --data is the CIFAR-10 .npz cifar10-speed reads: with none, it trained on the built-in digits for 20
    # epochs without a word, a user's "CIFAR-10" run on other images
    return Config(
        data=DataConfig(source=".devdata/cifar10.npz", augment="crop+flip"),
        model=ModelConfig(name="resnet18"),
        optim=OptimConfig(optimizer="sgd", lr=0.2, lr_batch=512, weight_decay=5e-4, label_smoothing=0.1),
        run=RunConfig(epochs=20, batch_size=512),
    )


def cifar10_speed() -> Config:
    """The fast CIFAR-10 recipe for fastnet, airbench94's ideas in cnnpar's switches: the whole
    uint8 set resident on the GPU; 2 px translate and alternating flip on the device; bf16 and
    channels_last; a whitened stem whose filters stay as the data set them and whose bias trains
    for 3 epochs only; label smoothing 0.2; Nesterov SGD (momentum 0.85) with BatchNorm biases at
    64x the lr; lookahead weight averaging from 30 % of training on (decay 0.95 per step, every 5
    steps, growing as progress cubed); test-time flip + 1 px translate.

    airbench94 states its lr and weight decay per 1024 samples of a summed loss (lr 11.5, wd
    0.0153, `kilostep_scale = 1024 * (1 + 1 / (1 - momentum))`); for cnnpar's mean loss at batch
    1024 that is lr 11.5 / (1 + 1 / 0.15) = 1.5 and a coupled weight decay of
    0.0153 * 1024 / (1024 * 7.667) / 1.5 = 1.33e-3 (the same shrink per step). Its triangular
    schedule (0.2 -> 1 at 23 % -> 0.07) is approximated by onecycle with 23 % warm-up.
    Where it differs from airbench94 besides: the BatchNorm biases are not decayed (airbench94 decays them by
    wd / lr_biases, the same shrink per step: --bias-decay). On an H200, 10 epochs, 5 seeds each: 90.46 % mean
    final accuracy without, 90.58 % with, a difference inside either set's spread of seeds (0.34 and 0.28 points;
    call ZZZZM), so the preset was left as it was measured before.
    Point --data at a decoded CIFAR-10 .npz (benchmarks/prepare_cifar10.py)."""
    return Config(
        data=DataConfig(source=".devdata/cifar10.npz", augment="translate+altflip", resident="on"),
        model=ModelConfig(name="fastnet"),
        optim=OptimConfig(
            optimizer="sgd",
            lr=1.5,
            lr_batch=1024,
            momentum=0.85,
            weight_decay=1.33e-3,
            bias_lr_scale=64.0,
            label_smoothing=0.2,
            warmup=0.23,
            schedule="onecycle",
            ema=0.95,
            ema_every=5,
            ema_start=0.3,
            ema_warmup=3.0,
            lookahead=True,
            whiten_bias_epochs=3,
            whiten_frozen=True,
        ),
        run=RunConfig(epochs=10, batch_size=1024, tta_level="flip+translate", eval_every=10),
    )


def cifar10_record() -> Config:
    """airbench94_muon's recipe for fastnet (KellerJordan/cifar10-airbench), in cnnpar's switches:
    8 epochs of 2,000 images; Muon for the conv filters (lr 0.24, Nesterov momentum 0.6, 3
    Newton-Schulz steps, each filter bank rescaled to norm sqrt(out) before every step); SGD with
    Nesterov momentum 0.85 for the rest; no warm-up, the lr falling linearly to 0; no weight
    averaging; the frozen whitened stem with its bias trained 3 epochs; 2 px translate, alternating
    flip, label smoothing 0.2, flip + translate TTA; fastnet compiled (warmed up outside the timed
    epochs). Muon's step does not depend on the gradient's scale, so its values carry over as they are.

    airbench sums its loss over the batch; cnnpar averages it, so an SGD lr is airbench's x 2000.
    Its BatchNorm biases: 0.053 x 2000 = 106. Its head computes (W / 256) x with W of std 1, fastnet's
    (W / 9) x with W of std 0.036 (the same logits at the start); the same steps in logit space need
    lr 0.67 x 2000 x 9^2 / 256^2 = 1.656, and the biases are then at 106 / 1.656 = 64x. airbench's
    decay is coupled and set per group as 0.004 / (the group's peak lr), so lr x decay, the share
    every group shrinks by per step, is 0.004 x (lr / peak lr) for all of them: weight decay
    0.004 / 1.656 = 2.415e-3, and on the biases (--bias-decay) that / 64.

    Where it still differs from airbench94_muon: the stem's bias follows the shared schedule for its
    3 epochs, then stops (airbench's falls to 0 over those epochs); fastnet starts its widening
    convs' extra filters He-normal (airbench: torch's default uniform), centres the patches it
    whitens, and trains in bf16 autocast (airbench: fp16 weights). Point --data at a decoded
    CIFAR-10 .npz (benchmarks/prepare_cifar10.py); on a CPU add --compile off."""
    return Config(
        data=DataConfig(source=".devdata/cifar10.npz", augment="translate+altflip", resident="on"),
        model=ModelConfig(name="fastnet"),
        optim=OptimConfig(
            optimizer="muon",
            lr=1.656,
            lr_batch=2000,
            momentum=0.85,
            weight_decay=2.415e-3,
            bias_lr_scale=64.0,
            bias_decay=True,
            muon_lr=0.24,
            muon_momentum=0.6,
            muon_ns_steps=3,
            muon_normalize=True,
            label_smoothing=0.2,
            warmup=0.0,
            schedule="onecycle",
            whiten_bias_epochs=3,
            whiten_frozen=True,
        ),
        speed=SpeedConfig(compile="default", compile_eval=True),
        run=RunConfig(epochs=8, batch_size=2000, tta_level="flip+translate", eval_every=8),
    )


def throughput() -> Config:
    """Synthetic data, no validation between epochs: for measuring the train step alone."""
    return Config(
        data=DataConfig(source="synthetic", image_shape="3x224x224", synthetic_samples=8192),
        model=ModelConfig(name="resnet50"),
        optim=OptimConfig(lr_batch=256),
        speed=SpeedConfig(),
        run=RunConfig(epochs=1, batch_size=256, eval_every=1000),
    )


PRESETS: dict[str, Callable[[], Config]] = {
    "default": default,
    "mnist": mnist,
    "cifar10-resnet18": cifar10_resnet18,
    "cifar10-speed": cifar10_speed,
    "cifar10-record": cifar10_record,
    "throughput": throughput,
}


# One line each, what a preset trains and what it needs: `--preset`'s help, and README.md's table says the same
PRESET_LINES = {
    "default": "cnn3 on the built-in digits, a short CPU-friendly run (as with no --preset)",
    "mnist": "cnn3 on ./mnist.npz (x_train, y_train; --data FILE for another path), 3 epochs at batch 128",
    "cifar10-resnet18": "resnet18, SGD lr 0.2 at batch 512, 20 epochs, crop+flip, on --data .devdata/cifar10.npz "
    "(--data FILE for another CIFAR-10 .npz)",
    "cifar10-speed": "airbench94's recipe for fastnet (10 epochs, batch 1024, lookahead, flip+translate TTA) on "
    "--data .devdata/cifar10.npz",
    "cifar10-record": "airbench94_muon's recipe for fastnet (8 epochs of 2,000, Muon, compiled: on a CPU add "
    "--compile off) on --data .devdata/cifar10.npz",
    "throughput": "resnet50 on 8,192 synthetic 3x224x224 images, 1 epoch at batch 256: the train step's speed",
}


def get_preset(name: str) -> Config:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"preset {name!r}: expected one of {', '.join(PRESETS)}") from None


def with_overrides(cfg: Config, **sections: dict) -> Config:
    """`with_overrides(cfg, run={"epochs": 1})` -> a new Config with those fields replaced."""
    return replace(cfg, **{k: replace(getattr(cfg, k), **v) for k, v in sections.items()})
