"""Config validation names the field; TOML out and back in gives the same config."""

from __future__ import annotations

from dataclasses import fields

import pytest

from cnnpar.config import (
    SECTIONS,
    Config,
    DataConfig,
    OptimConfig,
    RunConfig,
    SpeedConfig,
    dumps_toml,
    from_dict,
    load_toml,
    parse_shape,
    resolve_for_device,
)
from cnnpar.errors import ConfigError


@pytest.mark.parametrize(
    "build,field",
    [
        (lambda: DataConfig(val_fraction=1.0), "data.val_fraction"),
        (lambda: DataConfig(workers=-2), "data.workers"),
        (lambda: DataConfig(image_shape="3x32x32x1"), "data.image_shape (--image-shape) = '3x32x32x1'"),
        (lambda: OptimConfig(lr=-0.1), "optim.lr"),  # 0 is auto: the optimizer's own lr
        (lambda: OptimConfig(optimizer="lbfgs"), "optim.optimizer"),
        (lambda: OptimConfig(label_smoothing=1.5), "optim.label_smoothing"),
        (lambda: SpeedConfig(precision="fp8"), "speed.precision"),
        (lambda: RunConfig(epochs=0), "run.epochs"),
        (lambda: RunConfig(batch_size=-1), "run.batch_size"),
    ],
)
def test_invalid_values_name_their_field(build, field):
    with pytest.raises(ConfigError) as e:
        build()
    assert field in str(e.value) and "expected" in str(e.value)


FLOAT_FIELDS = [
    (sec, f.name)
    for sec in SECTIONS
    for f in fields(getattr(Config(), sec))
    if isinstance(getattr(getattr(Config(), sec), f.name), float)
]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(("section", "name"), FLOAT_FIELDS)
def test_every_float_field_refuses_nan_and_inf(section, name, value):
    """NaN fails no comparison and inf passes `> 0`: lr=inf, momentum=nan, weight_decay=nan were taken."""
    with pytest.raises(ConfigError) as e:
        from_dict({section: {name: value}})
    assert (
        str(e.value)
        == f"{section}.{name} (--{name.replace('_', '-')}) = {value}: expected a finite number, not nan or inf"
    )


def test_negative_weight_decay_is_refused():
    with pytest.raises(ConfigError, match=r"optim\.weight_decay \(--weight-decay\) = -0\.1: expected a number >= 0"):
        OptimConfig(weight_decay=-0.1)


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5])
def test_momentum_outside_0_to_1_is_refused(value):
    """Momentum 1 or more made SGD diverge (--momentum 1.5 at epoch 2, with advice to lower the lr)."""
    with pytest.raises(ConfigError) as e:
        OptimConfig(momentum=value)
    assert str(e.value) == f"optim.momentum (--momentum) = {value}: expected 0 <= value < 1"


def test_momentum_0_is_taken():
    assert OptimConfig(momentum=0.0).momentum == 0.0


def test_choice_errors_list_the_allowed_values():
    with pytest.raises(
        ConfigError, match=r"speed\.precision \(--precision\) = 'fp8': expected one of auto, fp32, tf32, bf16, fp16"
    ):
        SpeedConfig(precision="fp8")


def test_from_dict_names_unknown_keys_sections_and_wrong_types():
    with pytest.raises(ConfigError, match=r"f\.toml: unknown setting run\.epoch; known: epochs"):
        from_dict({"run": {"epoch": 3}}, origin="f.toml")
    with pytest.raises(ConfigError, match=r"unknown section\(s\) \['training'\]"):
        from_dict({"training": {}})
    with pytest.raises(ConfigError, match=r"run\.epochs \(--epochs\) = '3': expected a whole number"):
        from_dict({"run": {"epochs": "3"}})
    with pytest.raises(ConfigError, match=r"run\.progress \(--progress\) = 1: expected true or false"):
        from_dict({"run": {"progress": 1}})
    assert from_dict({"optim": {"lr": 1}}).optim.lr == 1.0  # an int where a float is wanted is fine


def test_toml_round_trip_keeps_every_field(tmp_path):
    cfg = Config(
        data=DataConfig(source="train.csv", image_shape="3x32x32", val_fraction=0.1),
        optim=OptimConfig(optimizer="sgd", lr=0.05, label_smoothing=0.1),
        speed=SpeedConfig(precision="bf16", channels_last="on"),
        run=RunConfig(epochs=3, batch_size=128, name="x"),
    )
    path = tmp_path / "config.toml"
    # A run folder's config.toml starts with environment facts as comments; they must not matter.
    path.write_text("# device = cpu\n# torch = 2.x\n" + dumps_toml(cfg))
    assert load_toml(path) == cfg


def test_load_toml_names_the_file_when_it_is_missing_or_broken(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml: config file not found"):
        load_toml(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\nepochs = 2\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_toml(bad)


def test_parse_shape_accepts_grey_and_colour():
    assert parse_shape("28x28") == (1, 28, 28)
    assert parse_shape("3x32x32") == (3, 32, 32)
    assert parse_shape("4x32x32") == (4, 32, 32)  # 4 channels: the models take any count
    with pytest.raises(ConfigError):
        parse_shape("0x4x4")


def test_auto_resolves_to_device_friendly_choices():
    cfg = resolve_for_device(Config(), "cpu", bf16_ok=True)
    assert (cfg.speed.precision, cfg.speed.channels_last, cfg.speed.compile) == ("fp32", "on", "off")
    assert cfg.data.pin_memory == "off" and cfg.data.prefetch_stream == "off"
    assert resolve_for_device(Config(), "cpu", bf16_ok=True, cpu_bf16=True).speed.precision == "bf16"
    explicit = Config(speed=SpeedConfig(precision="fp32", channels_last="off"))
    kept = resolve_for_device(explicit, "cpu", bf16_ok=True, cpu_bf16=True).speed
    assert (kept.precision, kept.channels_last) == ("fp32", "off")  # only "auto" is resolved
    gpu = resolve_for_device(Config(), "cuda", bf16_ok=True)
    assert (gpu.speed.precision, gpu.speed.channels_last, gpu.data.pin_memory) == ("bf16", "on", "on")


def test_ddp_switches_are_checked_where_they_cannot_apply():
    from cnnpar.config import Config, DistConfig, OptimConfig

    with pytest.raises(
        ConfigError, match=r"dist.ddp_bucket_mb \(--ddp-bucket-mb\) = -1.0: expected 0 \(torch's own\) or a size in MiB"
    ):
        DistConfig(ddp_bucket_mb=-1.0)
    with pytest.raises(
        ConfigError,
        match=r"\(--ddp-static-graph\) .* DDP's switches; dist.strategy \(--strategy\) = 'horovod' averages",
    ):
        DistConfig(strategy="horovod", ddp_broadcast_buffers=False)
    # DDP's static graph is recorded on its first step, which accumulation would run under no_sync
    with pytest.raises(
        ConfigError,
        match=r"dist.ddp_static_graph \(--ddp-static-graph\) with optim.grad_accum \(--grad-accum\) = 2: .* drop one",
    ):
        Config(dist=DistConfig(ddp_static_graph=True), optim=OptimConfig(grad_accum=2))
    assert Config(dist=DistConfig(ddp_static_graph=True, ddp_bucket_mb=50.0)).dist.ddp_bucket_mb == 50.0


def test_gradient_clipping_under_horovod_is_refused_with_the_config():
    """It was refused in each rank after hvd.init() and a whole Trainer set-up, and horovodrun added a traceback."""
    from cnnpar.config import DistConfig

    with pytest.raises(ConfigError) as e:
        Config(dist=DistConfig(strategy="horovod"), optim=OptimConfig(grad_clip=1.0))
    assert str(e.value) == (
        "optim.grad_clip (--grad-clip) = 1.0 is not supported with dist.strategy (--strategy) = 'horovod': "
        "expected --strategy ddp, or --grad-clip 0"
    )
    assert Config(dist=DistConfig(strategy="horovod")).optim.grad_clip == 0.0
    assert Config(optim=OptimConfig(grad_clip=1.0)).dist.strategy == "ddp"


def test_config_resolves_without_importing_presets():
    """presets.py imports config at module level; config importing presets back (it once did, inside
    resolve_for_device, for compile_default) made an import cycle. A fresh interpreter shows it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from cnnpar.config import Config, ModelConfig, resolve_for_device\n"
        "cfg = resolve_for_device(Config(model=ModelConfig(name='resnet50')), 'cuda', bf16_ok=True)\n"
        "assert cfg.speed.compile == 'default', cfg.speed.compile\n"
        "assert 'cnnpar.presets' not in sys.modules, 'config imported presets'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_speed_choices_left_at_auto_are_given_their_reasons_and_typed_ones_none():
    """The run's start printed `bf16, channels_last on, compile off` with no word on why (an audit of the defaults)."""
    from cnnpar.config import resolve_for_device, speed_reasons
    from cnnpar.presets import with_overrides

    auto = Config()
    cpu = resolve_for_device(auto, "cpu", False, cpu_bf16=True)
    said = speed_reasons(auto, cpu, "cpu")
    assert said.startswith("auto: bf16: this CPU computes bf16 natively")
    assert "channels_last on: " in said and "compile off: on the CPU" in said
    no_bf16 = resolve_for_device(auto, "cpu", False, cpu_bf16=False)
    assert "fp32: this CPU has no native bf16" in speed_reasons(auto, no_bf16, "cpu")
    resnet = with_overrides(auto, model={"name": "resnet50"})
    gpu = resolve_for_device(resnet, "cuda", True)
    assert "compile default: measured faster for resnet50 on an H200" in speed_reasons(resnet, gpu, "cuda")
    typed = with_overrides(auto, speed={"precision": "fp32", "channels_last": "off", "compile": "off"})
    assert speed_reasons(typed, resolve_for_device(typed, "cpu", False, cpu_bf16=True), "cpu") == ""


@pytest.mark.parametrize(
    "field,value,top",
    [("num_classes", 2**63 - 1, "1,000,000"), ("num_classes", -1, "1,000,000"), ("image_size", 20000, "8,192")],
)
def test_class_count_and_image_size_are_bounded(field, value, top):
    """num_classes = 2**63 - 1 built a list of that many class names until the OOM killer came (no message);
    --image-size 20000 asked the digits' resize for 2.9 TB and stopped in a traceback."""
    with pytest.raises(ConfigError) as e:
        DataConfig(**{field: value})
    flag = "--" + field.replace("_", "-")
    assert str(e.value) == f"data.{field} ({flag}) = {value}: expected 0 (auto) or 1..{top}"
    assert DataConfig(num_classes=1_000_000, image_size=8192).image_size == 8192


@pytest.mark.parametrize("seed", [2**64, 2**63, -1])
def test_a_seed_outside_0_to_2_63_is_refused_in_one_line(seed):
    """--seed 2**64 ended in torch's "Overflow when unpacking long long" traceback at the hold-out; -1 and 2**63
    trained (2**63 on seed 0's augmentation draws, which are taken mod 2**63)."""
    with pytest.raises(ConfigError) as e:
        RunConfig(seed=seed)
    assert str(e.value) == f"run.seed (--seed) = {seed}: expected 0 <= value < 2**63"
    assert RunConfig(seed=2**63 - 1).seed == 2**63 - 1


def test_load_toml_refuses_a_folder_or_a_file_that_is_not_utf8_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^\S+dir\.toml: a folder: expected a TOML config file$"):
        load_toml((tmp_path / "dir.toml").mkdir() or tmp_path / "dir.toml")
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b"[run]\nepochs = 1\n# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1\.toml: not UTF-8 text \(byte 0xe9 at offset 22\): expected a TOML"):
        load_toml(latin1)
    binary = tmp_path / "last.pt"
    binary.write_bytes(b"PK\x03\x04\x14\x00\x00\x08\x08\x00\x88\x9f")
    with pytest.raises(ConfigError, match=r"last\.pt: not UTF-8 text \(byte 0x88 at offset 10\)"):
        load_toml(binary)


def test_load_toml_reads_a_file_that_starts_with_a_bom(tmp_path):
    """Windows Notepad writes one; it was refused as "Invalid statement (at line 1, column 1)"."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[run]\nepochs = 3\n")
    assert load_toml(path).run.epochs == 3


@pytest.mark.parametrize(
    "text,message",
    [
        ("[data]\nval_fraction = 1.5\n", "data.val_fraction (--val-fraction) = 1.5: expected 0 <= value < 1"),
        ('[optim]\noptimizer = "adam"\n', "optim.optimizer (--optimizer) = 'adam': expected one of sgd, adamw, muon"),
        ('[data]\nimage_shape = "32x32x3"\n', "data.image_shape (--image-shape) = '32x32x3': channels come first"),
    ],
)
def test_a_range_error_in_a_config_file_names_the_file(tmp_path, text, message):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_toml(path)
    assert str(e.value).startswith(f"{path}: {message}")


def _parsed(*words: str) -> Config:
    from cnnpar.cli import build_parser
    from cnnpar.cliargs import config_from_args

    return config_from_args(build_parser().parse_args(["train", *words]))


def test_a_typed_flag_replaces_a_bad_file_value_before_it_is_checked(tmp_path):
    """`--config c.toml --val-fraction 0.1` over the file's 1.5 said `(--val-fraction) = 1.5`, naming no file."""
    path = tmp_path / "c.toml"
    path.write_text("[data]\nval_fraction = 1.5\n[run]\nepochs = -1\n")
    assert _parsed("--config", str(path), "--val-fraction", "0.1", "--epochs", "2").data.val_fraction == 0.1
    with pytest.raises(ConfigError) as e:  # the file's epochs stays bad where no flag replaces it
        _parsed("--config", str(path), "--val-fraction", "0.1")
    assert str(e.value) == f"{path}: run.epochs (--epochs) = -1: expected a number > 0"
    with pytest.raises(ConfigError) as e:  # a bad typed value is the command line's, whatever the file holds
        _parsed("--config", str(path), "--val-fraction", "1.2", "--epochs", "2")
    assert str(e.value) == "data.val_fraction (--val-fraction) = 1.2: expected 0 <= value < 1"
    path.write_text('data = "digits"\n')  # no table: no typed flag mends it
    with pytest.raises(ConfigError, match=r"c\.toml: \[data\] must be a table of settings$"):
        _parsed("--config", str(path), "--val-fraction", "0.1")


@pytest.mark.parametrize(
    "device, advice",
    [
        (
            "cuda:1",
            "CUDA_VISIBLE_DEVICES=1 with --device cuda trains on GPU 1; cnnpar train --nproc N trains on N GPUs",
        ),
        ("cuda:0", "--device cuda is GPU 0"),
        ("mps", "not on an Apple GPU through MPS: auto picks the CPU there"),
        ("CUDA", "(written in lower case: cuda)"),
        ("cuda ", "(written without spaces: cuda)"),  # was "written in lower case", which it was
        (" Cpu", "(written in lower case and without spaces: cpu)"),
    ],
)
def test_a_torch_device_name_in_a_config_file_is_refused_with_what_to_do(tmp_path, device, advice):
    """PyTorch's `cuda:1` habit (cnnpar picks the GPU by local rank, so by CUDA_VISIBLE_DEVICES) and Apple's `mps`
    were refused with the allowed values only."""
    path = tmp_path / "gpu.toml"
    path.write_text(f'[speed]\ndevice = "{device}"\n')
    with pytest.raises(ConfigError) as e:
        load_toml(path)
    line = str(e.value)
    assert line.startswith(f"{path}: speed.device (--device) = '{device}': expected one of auto, cpu, cuda (")
    assert advice in line and "\n" not in line
