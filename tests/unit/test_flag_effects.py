"""A flag the user typed that does nothing in the run's config is named in a note (flag_effects.py), not silently
ignored; one that the config turns into its opposite (--no-tta-flip under a TTA level) is refused. Values from a
preset, a --config file or a resumed run's record say nothing: only what was typed is the user's wish."""

from __future__ import annotations

import pytest

from cnnpar.config import Config
from cnnpar.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

NOTE = "cnnpar: note: "


def _parsed(*words: str, command: str = "train") -> Config:
    from cnnpar.cli import build_parser
    from cnnpar.cliargs import config_from_args

    return config_from_args(build_parser().parse_args([command, *words]))


def _notes(capsys, *words: str, command: str = "train") -> list[str]:
    _parsed(*words, command=command)
    return [line[len(NOTE) :] for line in capsys.readouterr().err.splitlines() if line.startswith(NOTE)]


MUON_WHY = "not used: the optimizer is adamw, and only Muon reads it: add --optimizer muon"


@pytest.mark.parametrize(
    "typed",
    [("--muon-lr", "0.1"), ("--muon-momentum", "0.5"), ("--muon-ns-steps", "5"), ("--muon-normalize",)],
)
def test_a_muon_setting_typed_without_muon_is_named_and_not_with_muon_or_from_a_preset(capsys, typed):
    assert _notes(capsys, *typed) == [f"{' '.join(typed)} {MUON_WHY}"]
    assert _notes(capsys, "--optimizer", "muon", *typed) == []
    # cifar10-record sets every Muon setting; another optimizer typed leaves them unused, but nobody typed them
    assert _notes(capsys, "--preset", "cifar10-record", "--optimizer", "sgd") == []
    assert _notes(capsys, "--no-muon-normalize") == []  # asks for nothing


def test_momentum_typed_with_adamw_is_named_and_not_with_sgd_or_muon_or_from_a_preset(capsys):
    assert _notes(capsys, "--momentum", "0.8") == [
        "--momentum 0.8 not used: the optimizer is adamw, which has no momentum setting (its betas are torch's): "
        "--optimizer sgd or muon uses it"
    ]
    assert _notes(capsys, "--optimizer", "sgd", "--momentum", "0.8") == []
    assert _notes(capsys, "--optimizer", "muon", "--momentum", "0.8") == []  # Muon's SGD groups read it
    assert _notes(capsys, "--preset", "cifar10-record", "--optimizer", "adamw") == []  # the preset's momentum


@pytest.mark.parametrize(
    "typed", [("--ema-every", "5"), ("--ema-start", "0.3"), ("--ema-warmup", "3")], ids=lambda t: t[0]
)
def test_an_average_setting_typed_without_an_average_is_named_and_not_with_one_or_from_a_file(capsys, tmp_path, typed):
    flag, value = typed
    assert _notes(capsys, *typed) == [
        f"{flag} {value} not used: no weight average is kept (--ema is 0): give --ema a decay, e.g. --ema 0.95"
    ]
    assert _notes(capsys, "--ema", "0.95", *typed) == []
    config = tmp_path / "c.toml"
    config.write_text("[optim]\nema_every = 5\nema_start = 0.3\nema_warmup = 3.0\n")
    assert _notes(capsys, "--config", str(config)) == []
    assert _notes(capsys, "--config", str(config), "--epochs", "2") == []


def test_lookahead_without_an_average_stays_refused(capsys):
    with pytest.raises(
        ConfigError, match=r"optim.lookahead \(--lookahead\) = true needs an average .* optim.ema \(--ema\)"
    ):
        _parsed("--lookahead")


def test_compile_eval_typed_with_compile_off_is_named_and_not_compiled_or_from_a_preset(capsys):
    assert _notes(capsys, "--compile", "off", "--compile-eval") == [
        "--compile-eval not used: --compile is off, so there is no compiled model to evaluate through: give "
        "--compile a mode, e.g. default"
    ]
    assert _notes(capsys, "--compile", "default", "--compile-eval") == []
    # cifar10-record sets compile_eval; its docstring's "on a CPU add --compile off" is no news
    assert _notes(capsys, "--preset", "cifar10-record", "--compile", "off") == []


def test_compile_eval_typed_where_compile_auto_resolves_to_off_is_named(capsys, monkeypatch):
    """The audit's run: `--compile-eval` with compile left at auto, which is off on the CPU (config.compile_default),
    trained without a word; the rule reads compile as the run resolves it."""
    import torch

    off = "so there is no compiled model to evaluate through: give --compile a mode, e.g. default"
    assert _notes(capsys, "--compile-eval", "--device", "cpu") == [
        f"--compile-eval not used: --compile auto is off on the CPU, {off}"
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _notes(capsys, "--compile-eval") == [f"--compile-eval not used: --compile auto is off on the CPU, {off}"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --device auto then picks CUDA
    assert _notes(capsys, "--compile-eval") == [
        f"--compile-eval not used: --compile auto is off for cnn3 on CUDA, {off}"
    ]
    assert _notes(capsys, "--compile-eval", "--model", "resnet18") == []  # auto compiles resnet18 on CUDA
    assert _notes(capsys, "--compile-eval", "--model", "resnet18", "--device", "cpu") == [
        f"--compile-eval not used: --compile auto is off on the CPU, {off}"
    ]


def test_compile_eval_typed_where_the_average_or_ddp_evaluates_is_named(capsys, monkeypatch):
    """Trainer.evaluate goes through the compiled model with one process and no weight average only."""
    on = ("--compile", "default", "--compile-eval")
    assert _notes(capsys, *on, "--ema", "0.95") == [
        "--compile-eval not used: the weight average (--ema) evaluates, as a plain module: it applies without --ema"
    ]
    ddp = (
        "--compile-eval not used: each of the 2 processes evaluates the plain module (DDP's wrapper would all-reduce "
        "inside its forward, which ranks with unequal evaluation batches cannot pair): it applies to one process"
    )
    assert _notes(capsys, *on, "--nproc", "2") == [ddp]
    monkeypatch.setenv("WORLD_SIZE", "2")  # a torchrun started by hand: rank 0 says it
    monkeypatch.setenv("RANK", "0")
    assert _notes(capsys, *on) == [ddp]
    assert _notes(capsys, *on, "--debug-single") == []  # one process, whatever torchrun started
    monkeypatch.setenv("RANK", "1")
    assert _notes(capsys, *on) == []  # the other ranks keep quiet


def test_a_horovod_rank_other_than_0_prints_no_notes(capsys, monkeypatch):
    for key in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    assert _notes(capsys, "--momentum", "0.8") == []
    monkeypatch.setenv("HOROVOD_RANK", "0")
    assert len(_notes(capsys, "--momentum", "0.8")) == 1


IN_MEMORY = "so no JPEG is decoded while training: it applies to --data <a folder of photos>"


@pytest.mark.parametrize(
    ("data", "held"),
    [
        ([], "--data digits is built-in data made in memory"),
        (["--data", "synthetic"], "--data synthetic is built-in data made in memory"),
        (["--data", "x.npz"], "--data x.npz is an .npz read into memory as pixels"),
        (["--data", "x.csv"], "--data x.csv is a CSV read into memory as pixels"),
        (["--data", "x.cnnpar"], "--data x.cnnpar is a prepared store, its photos decoded once by cnnpar prepare"),
    ],
    ids=["digits", "synthetic", "npz", "csv", "store"],
)
def test_decode_settings_typed_on_data_with_no_jpegs_are_named(capsys, data, held):
    typed = ["--decode", "gpu", "--cpu-share", "0.3", "--gpu-resize", "loop"]
    assert _notes(capsys, *data, *typed) == [
        f"--decode gpu not used: {held}, {IN_MEMORY}",
        f"--cpu-share 0.3 not used: {held}, {IN_MEMORY}",
        f"--gpu-resize loop not used: {held}, {IN_MEMORY}",
    ]
    assert _notes(capsys, *data, "--decode", "auto", "--cpu-share", "0", "--gpu-resize", "auto") == []


def test_decode_settings_on_a_folder_of_photos_are_named_only_where_its_loader_does_not_read_them(
    capsys, tmp_path, monkeypatch
):
    import torch

    folder = ["--data", str(tmp_path)]
    gpu = ["--decode", "gpu", "--cpu-share", "0.3", "--gpu-resize", "loop"]
    assert _notes(capsys, *folder, *gpu) == []
    assert _notes(capsys, *folder, "--decode", "hardware", "--cpu-share", "0.3") == []
    assert _notes(capsys, *folder, "--decode", "cpu", "--cpu-share", "0.3", "--gpu-resize", "loop") == [
        f"{flag} not used: with --decode cpu the worker processes decode and resize each photo themselves: "
        "--decode gpu, hardware or nvimgcodec uses it"
        for flag in ("--cpu-share 0.3", "--gpu-resize loop")
    ]
    auto_cpu = "--cpu-share 0.3 not used: --decode auto picks cpu on the CPU (worker processes): --decode gpu uses it"
    assert _notes(capsys, *folder, "--device", "cpu", "--cpu-share", "0.3") == [auto_cpu]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # --device auto resolves to the CPU too
    assert _notes(capsys, *folder, "--cpu-share", "0.3") == [auto_cpu]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # and with CUDA, auto picks a GPU decoder
    assert _notes(capsys, *folder, "--cpu-share", "0.3") == []
    assert _notes(capsys, *folder, "--loader", "textbook", "--decode", "gpu") == [
        "--decode gpu not used: --loader textbook decodes each photo on the host in its per-sample reads: "
        "--loader fast uses it"
    ]


def test_no_tta_flip_under_a_tta_level_is_refused_unless_a_level_is_typed_too(capsys):
    with pytest.raises(ConfigError) as refused:
        _parsed("--preset", "cifar10-speed", "--no-tta-flip")
    assert str(refused.value) == (
        "--no-tta-flip with tta_level = 'flip+translate' (from --preset cifar10-speed): the level decides the "
        "test-time augmentation and keeps the mirror: expected --tta-level none in place of --no-tta-flip "
        "(or --tta-level flip: the mirror without the shifts)"
    )
    cfg = _parsed("--preset", "cifar10-speed", "--no-tta-flip", "--tta-level", "none")
    assert cfg.run.tta_in_effect == "none" and capsys.readouterr().err == ""
    assert _notes(capsys, "--preset", "cifar10-speed", "--no-tta-flip", "--tta-level", "flip") == [
        "--no-tta-flip not used: --tta-level flip decides the test-time augmentation: --tta-level none turns it off"
    ]
    assert _notes(capsys, "--preset", "cifar10-speed", "--tta-flip") == []  # the mirror is in the level
    assert _notes(capsys, "--no-tta-flip") == []  # no level: the switch decides


def _record(tmp_path, body: str) -> list[str]:
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.toml").write_text(body)
    return ["--resume", "auto", "--name", "r", "--out-dir", str(tmp_path)]


def test_a_resumed_run_is_checked_on_its_own_settings(capsys, tmp_path):
    resume = _record(tmp_path, '[optim]\noptimizer = "sgd"\n[run]\ntta_level = "flip+translate"\n')
    assert _notes(capsys, *resume, "--momentum", "0.8") == []  # the run's sgd reads it
    assert _notes(capsys, *resume, "--muon-lr", "0.1") == [
        "--muon-lr 0.1 not used: the optimizer is sgd, and only Muon reads it: add --optimizer muon"
    ]
    with pytest.raises(ConfigError, match=r"--no-tta-flip with tta_level = 'flip\+translate' \(from .*config.toml\)"):
        _parsed(*resume, "--no-tta-flip")


@pytest.mark.parametrize("command", ["doctor", "tune", "profile", "bench"])
def test_every_command_that_takes_the_config_flags_says_it(capsys, command):
    assert _notes(capsys, "--muon-lr", "0.1", command=command) == [f"--muon-lr 0.1 {MUON_WHY}"]


def test_only_the_process_that_prints_notes_says_it(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # a torchrun worker: rank 0 speaks
    assert _notes(capsys, "--muon-lr", "0.1") == []
    with pytest.raises(ConfigError):  # a refusal stops every rank
        _parsed("--preset", "cifar10-speed", "--no-tta-flip")


ONE = "not used: one process runs, with no other to join: --nproc 2 or more (or torchrun) uses it"


def test_the_processes_settings_typed_for_one_process_are_named_and_not_for_several(capsys, monkeypatch):
    """--sync-bn, --ddp-bucket-mb and --timeout-s in a run of one process were kept in config.toml and did
    nothing; --nproc 2 beside the debug switch ran one process without a word."""
    for var in ("WORLD_SIZE", "RANK", "CNNPAR_DEBUG_SINGLE", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(var, raising=False)
    typed = ("--sync-bn", "--ddp-bucket-mb", "5", "--no-ddp-broadcast-buffers", "--timeout-s", "30")
    assert _notes(capsys, *typed) == [
        f"--sync-bn {ONE}",
        f"--timeout-s 30 {ONE}",
        f"--ddp-bucket-mb 5 {ONE}",
        f"--no-ddp-broadcast-buffers {ONE}",
    ]
    assert _notes(capsys, "--nproc", "2", *typed) == []
    # said once, by the debug switch's own start-up line with the global batch (tests/unit/test_dist_launch.py);
    # this note had said it a second time (session 33 review)
    assert _notes(capsys, "--nproc", "2", "--debug-single") == []
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun started by hand: nothing is idle
    assert _notes(capsys, "--sync-bn", "--timeout-s", "30") == []


def test_synthetic_samples_typed_for_data_with_its_own_samples_is_named_and_not_for_synthetic_or_a_preset(capsys):
    """data/sources.load_synthetic is the one reader of --synthetic-samples: on digits it trained the 1,797 digits."""
    assert _notes(capsys, "--synthetic-samples", "100") == [
        "--synthetic-samples 100 not used: --data digits holds its own samples: it sets how many --data synthetic makes"
    ]
    assert _notes(capsys, "--data", "x.npz", "--synthetic-samples", "100") == [
        "--synthetic-samples 100 not used: --data x.npz holds its own samples: it sets how many --data synthetic makes"
    ]
    assert _notes(capsys, "--data", "synthetic", "--synthetic-samples", "100") == []
    # throughput sets synthetic_samples = 8192: other data typed over it is the user's, the count the preset's
    assert _notes(capsys, "--preset", "throughput", "--data", "digits") == []


def _image_folder(root, *splits: str) -> None:
    """Five 8x8 PNGs of each of two classes in each split folder: enough for a hold-out to leave both classes."""
    from PIL import Image

    for split in splits:
        for name, colour in (("cat", (40, 90, 200)), ("dog", (200, 90, 40))):
            (root / split / name).mkdir(parents=True)
            for k in range(5):
                Image.new("RGB", (8, 8), colour).save(root / split / name / f"{k}.png")


def test_val_fraction_typed_for_data_with_its_own_validation_split_is_named_and_not_where_it_holds_out(
    capsys, tmp_path
):
    """data/sources._split: data with its own validation split validates on it, and --val-fraction holds nothing
    out. Told from the .npz's keys, the folder's names and the store's index, before any image is read."""
    import numpy as np

    from cnnpar.config import DataConfig
    from cnnpar.data import load_data
    from cnnpar.data.bundle import holdout_label
    from cnnpar.data.store_write import prepare_store

    x, y = np.zeros((10, 8, 8), np.uint8), np.arange(10) % 2
    with_test, without = tmp_path / "with_test.npz", tmp_path / "without.npz"
    np.savez(with_test, x_train=x, y_train=y, x_test=x, y_test=y)
    np.savez(without, x_train=x, y_train=y)
    split, alone, flat = tmp_path / "split", tmp_path / "alone", tmp_path / "flat"
    _image_folder(split, "train", "valid")
    _image_folder(alone, "train")
    _image_folder(flat, ".")
    split_store, flat_store = tmp_path / "split.cnnpar", tmp_path / "flat.cnnpar"
    prepare_store(split, split_store, workers=0, progress=False)
    prepare_store(flat, flat_store, workers=0, progress=False)
    typed = ("--val-fraction", "0.1")
    why = "so nothing is held out: it applies to data without one"
    assert _notes(capsys, "--data", str(with_test), *typed) == [
        f"--val-fraction 0.1 not used: --data {with_test} validates on its own test split (x_test, y_test), {why}"
    ]
    assert _notes(capsys, "--data", str(split), *typed) == [
        f"--val-fraction 0.1 not used: --data {split} validates on its own validation split (valid/), {why}"
    ]
    assert _notes(capsys, "--data", str(split_store), *typed) == [
        f"--val-fraction 0.1 not used: --data {split_store} validates on its own validation split (its folder's "
        f"val/, valid/, validation/ or test/), {why}"
    ]
    for holds_out in (without, alone, flat, flat_store, "digits", "synthetic", tmp_path / "rows.csv"):
        assert _notes(capsys, "--data", str(holds_out), *typed) == [], holds_out
    # as the readers decide it
    for own in (with_test, split, split_store):
        assert load_data(DataConfig(source=str(own), val_fraction=0.1)).val_from != holdout_label(0.1), own
    for holds_out in (without, alone, flat, flat_store, "digits", "synthetic"):
        assert load_data(DataConfig(source=str(holds_out), val_fraction=0.1)).val_from == holdout_label(0.1)
    assert _notes(capsys, "--data", str(with_test), "--val-fraction", "0") == []  # asks for no hold-out


def test_eval_every_typed_where_nothing_validates_is_named_and_not_where_a_split_does(capsys, tmp_path):
    """The trainer evaluates every --eval-every epochs on the validation split: --val-fraction 0 on data without one
    of its own leaves none, and --eval-every 2 trained as if it had not been typed (found by a flag fuzzer)."""
    import numpy as np

    from cnnpar.config import DataConfig
    from cnnpar.data import load_data

    x, y = np.zeros((10, 8, 8), np.uint8), np.arange(10) % 2
    with_test = tmp_path / "with_test.npz"
    np.savez(with_test, x_train=x, y_train=y, x_test=x, y_test=y)
    split = tmp_path / "split"
    _image_folder(split, "train", "valid")
    why = "which has no validation split of its own, so no epoch is evaluated: give --val-fraction a share, e.g. 0.2"
    for source in ("synthetic", "digits"):
        assert _notes(capsys, "--data", source, "--val-fraction", "0", "--eval-every", "2") == [
            f"--eval-every 2 not used: --val-fraction 0 holds nothing out of --data {source}, {why}"
        ]
        assert load_data(DataConfig(source=source, val_fraction=0.0, synthetic_samples=64)).val is None
        assert _notes(capsys, "--data", source, "--eval-every", "2") == []  # the default hold-out validates
    for own in (with_test, split):
        assert _notes(capsys, "--data", str(own), "--val-fraction", "0", "--eval-every", "2") == [], own
        assert load_data(DataConfig(source=str(own), val_fraction=0.0)).val is not None, own
    # a file that is not there: the run says so itself
    assert _notes(capsys, "--data", str(tmp_path / "gone.npz"), "--val-fraction", "0", "--eval-every", "2") == []


def test_lr_batch_typed_beside_a_fixed_batch_is_named_and_not_beside_an_automatic_one(capsys):
    """config.resolve_for_device and the trainer's batch search scale --lr from --lr-batch only to a batch that
    --batch-size auto chose: beside a fixed batch, typed or a preset's, the lr trained as it is."""
    fixed = (
        "not used: the batch size is fixed ({}), and a fixed batch trains at --lr as it is: --batch-size auto scales "
        "the lr from --lr-batch to the batch it chooses"
    )
    assert _notes(capsys, "--batch-size", "256", "--lr-batch", "128") == [f"--lr-batch 128 {fixed.format(256)}"]
    assert _notes(capsys, "--preset", "mnist", "--lr-batch", "256") == [f"--lr-batch 256 {fixed.format(128)}"]
    assert _notes(capsys, "--preset", "mnist", "--batch-size", "auto", "--lr-batch", "256") == []
    assert _notes(capsys, "--lr-batch", "128") == []  # the default batch is auto
    assert _notes(capsys, "--batch-size", "256", "--lr-batch", "auto") == []  # asks for nothing
    assert _notes(capsys, "--preset", "mnist") == []  # the preset's own lr_batch beside its own batch


def test_crop_min_scale_typed_on_arrays_is_named_and_not_on_photos(capsys, tmp_path):
    """Only image folders and stores draw random-resized crops: on arrays --crop-min-scale changed nothing."""
    assert _notes(capsys, "--data", "x.npz", "--crop-min-scale", "0.08") == [
        "--crop-min-scale 0.08 not used: --data x.npz is an .npz read into memory as pixels, whose images get "
        "--augment's pad-and-crop, not random-resized crops: it applies to --data <a folder of photos> or a .cnnpar "
        "store"
    ]
    (tmp_path / "photos").mkdir()
    assert _notes(capsys, "--data", str(tmp_path / "photos"), "--crop-min-scale", "0.08") == []
    assert _notes(capsys, "--data", "x.cnnpar", "--crop-min-scale", "0.08") == []


def test_worker_settings_typed_where_no_worker_starts_are_named_and_not_where_workers_start(capsys, tmp_path):
    """data/loader._host_loader hands --prefetch-factor and --persistent-workers to its worker processes only: with
    --workers 0, or auto on arrays (loader.auto_workers starts none for them), both trained as if not typed."""
    import numpy as np
    import torch

    from cnnpar.config import DataConfig
    from cnnpar.data import load_data
    from cnnpar.data.loader import auto_workers
    from cnnpar.dist import DistInfo

    zero = "not used: --workers 0 makes the batches in the main process, with no worker: --workers 1 or more uses it"
    assert _notes(capsys, "--workers", "0", "--prefetch-factor", "8", "--no-persistent-workers") == [
        f"--prefetch-factor 8 {zero}",
        f"--no-persistent-workers {zero}",
    ]
    npz = tmp_path / "x.npz"
    np.savez(npz, x_train=np.zeros((10, 8, 8), np.uint8), y_train=np.arange(10) % 2)
    arrays = "whose batches the main process indexes (--workers auto starts no worker for it): --workers 1 or more"
    assert _notes(capsys, "--data", str(npz), "--prefetch-factor", "8") == [
        f"--prefetch-factor 8 not used: --data {npz} is an .npz read into memory as pixels, {arrays} uses it"
    ]
    assert _notes(capsys, "--data", "synthetic", "--persistent-workers") == [
        f"--persistent-workers not used: --data synthetic is built-in data made in memory, {arrays} uses it"
    ]
    # as the loader decides it: no worker for arrays under auto
    cpu = DistInfo(0, 0, 1, torch.device("cpu"))
    for source in ("digits", "synthetic", str(npz)):
        assert auto_workers(load_data(DataConfig(source=source, synthetic_samples=20)).train, cpu) == 0, source
    assert _notes(capsys, "--workers", "2", "--prefetch-factor", "8", "--no-persistent-workers") == []
    (tmp_path / "photos").mkdir()
    assert _notes(capsys, "--data", str(tmp_path / "photos"), "--prefetch-factor", "8") == []
    assert _notes(capsys, "--workers", "0") == []  # the settings themselves untyped
    # the textbook loader reads arrays sample by sample (transforms.TextbookDataset): auto starts workers for it
    assert _notes(capsys, "--loader", "textbook", "--prefetch-factor", "8", "--no-persistent-workers") == []
    from cnnpar.data.transforms import TextbookDataset

    bundle = load_data(DataConfig(source="digits"))
    assert auto_workers(TextbookDataset(bundle.train, bundle.mean, bundle.std, "none", True), cpu) >= 1


def test_bias_decay_typed_without_weight_decay_is_named_and_not_with_it(capsys):
    """engine/optim.build_optimizer decays the biases by weight_decay / bias_lr_scale: at 0 there is none to share."""
    assert _notes(capsys, "--bias-decay", "--weight-decay", "0") == [
        "--bias-decay not used: --weight-decay is 0, so there is no decay to share with the biases: give "
        "--weight-decay a value"
    ]
    assert _notes(capsys, "--bias-decay") == []
    assert _notes(capsys, "--no-bias-decay", "--weight-decay", "0") == []  # asks for nothing


def test_cudnn_benchmark_typed_on_the_cpu_is_named_and_not_on_cuda(capsys, monkeypatch):
    """The trainer sets torch.backends.cudnn.benchmark, read by cuDNN alone: on the CPU either switch did nothing."""
    import torch

    why = "not used: the run is on the CPU, and only cuDNN (CUDA) times its algorithms: it applies with --device cuda"
    assert _notes(capsys, "--device", "cpu", "--no-cudnn-benchmark") == [f"--no-cudnn-benchmark {why}"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _notes(capsys, "--cudnn-benchmark") == [f"--cudnn-benchmark {why}"]  # auto picks the CPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _notes(capsys, "--no-cudnn-benchmark") == []
    assert _notes(capsys, "--device", "cpu") == []


def test_run_settings_typed_for_profile_are_named_and_not_for_train(capsys):
    """`cnnpar profile` records a few steps of a measuring Trainer into --report-dir: --eval-every, --tta-level,
    --name, --tensorboard or --monitor typed there profiled what it would have without them, unsaid."""
    why = (
        "not used: cnnpar profile records a few train steps, with no progress bar, evaluation, telemetry or run "
        "folder (its files go to --report-dir): it applies to cnnpar train"
    )
    typed = ["--eval-every", "2", "--tta-level", "flip", "--name", "x", "--tensorboard", "--monitor", "--progress"]
    assert _notes(capsys, *typed, command="profile") == [
        f"--name x {why}",
        f"--eval-every 2 {why}",
        f"--tta-level flip {why}",
        f"--tensorboard {why}",
        f"--monitor {why}",
        f"--progress {why}",
    ]
    asks_nothing = ["--tta-level", "none", "--no-tta-flip", "--no-tensorboard", "--no-monitor", "--no-progress"]
    assert _notes(capsys, *asks_nothing, command="profile") == []
    assert _notes(capsys, *typed, command="train") == []
    assert _notes(capsys, "--epochs", "3", "--max-steps", "5", command="profile") == []  # the schedule's length


RUN_TYPED = ["--eval-every", "2", "--tta-level", "flip", "--name", "x", "--tensorboard", "--monitor", "--progress"]


def _bench_notes(capsys, *words: str) -> list[str]:
    """The notes of a `cnnpar bench` that stops on a bad bench flag (`words`) after its config is read: the mode
    is cli.cmd_bench's, and nothing is loaded or measured."""
    from cnnpar.cli import main

    assert main(["bench", "--device", "cpu", *RUN_TYPED, *words]) == 2
    return [line[len(NOTE) :] for line in capsys.readouterr().err.splitlines() if line.startswith(NOTE)]


def test_run_settings_typed_for_bench_are_named_and_its_evaluation_settings_not_for_time_to_accuracy(capsys):
    """`cnnpar bench` times a measuring Trainer's steps (never fit(): no run folder, telemetry or TensorBoard) and
    writes its own tables; --time-to-accuracy evaluates after every epoch, with the --tta-level asked for."""
    why = (
        "not used: cnnpar bench times train steps, with no progress bar, evaluation, telemetry or run folder (its "
        "tables go to --out): it applies to cnnpar train"
    )
    assert _bench_notes(capsys, "--only", "warp_drive") == [
        f"--name x {why}",
        f"--eval-every 2 {why}",
        f"--tta-level flip {why}",
        f"--tensorboard {why}",
        f"--monitor {why}",
        f"--progress {why}",
    ]
    why = (
        "not used: cnnpar bench --time-to-accuracy evaluates after every epoch, to time the first that reaches "
        "--target, with no progress bar, telemetry or run folder (its tables go to --out): it applies to cnnpar train"
    )
    assert _bench_notes(capsys, "--time-to-accuracy", "--target", "99") == [
        f"--name x {why}",
        f"--eval-every 2 {why}",
        f"--tensorboard {why}",
        f"--monitor {why}",
        f"--progress {why}",
    ]


def test_run_settings_typed_for_bench_compare_are_named_as_unused_by_a_comparison(capsys, tmp_path):
    """`cnnpar bench --compare A B` reads two tables: its note said "cnnpar bench times train steps": it times none."""
    why = (
        "not used: cnnpar bench --compare sets two bench tables already written side by side, training nothing: it "
        "applies to cnnpar train"
    )
    gone = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    assert _bench_notes(capsys, "--compare", *gone)[:2] == [f"--name x {why}", f"--eval-every 2 {why}"]


def test_config_flags_typed_for_bench_compare_are_named_but_its_out_dir(capsys, tmp_path):
    """`cnnpar bench --compare A B --lr 0.1 --model resnet18` printed the two tables as if neither was typed: of the
    config only --out-dir is read (where compare.md goes without --out). A flag it does not read is named once,
    for that, not also for the data (--decode gpu on digits)."""
    from cnnpar.cli import main

    why = (
        "not used: cnnpar bench --compare sets two bench tables already written side by side, training nothing: it "
        "applies to cnnpar train"
    )
    gone = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    typed = ["--lr", "0.1", "--model", "resnet18", "--decode", "gpu", "--out-dir", str(tmp_path), "--no-progress"]
    assert main(["bench", "--compare", *gone, "--device", "cpu", *typed]) == 2
    err = capsys.readouterr().err.splitlines()
    notes = [line[len(NOTE) :] for line in err if line.startswith(NOTE)]
    assert notes == [
        f"--decode gpu {why}",
        f"--model resnet18 {why}",
        f"--lr 0.1 {why}",
        f"--device cpu {why}",
    ]
    assert err[-1] == f"cnnpar: error: {gone[0]}: file not found (expected a ladder.csv written by `cnnpar bench`)"


def test_out_dir_typed_for_bench_compare_beside_out_is_named(capsys, tmp_path):
    """`cnnpar bench --compare A B --out X --out-dir D` wrote compare.md into X and said nothing of D: --out-dir
    places it only without --out. The other flags keep their own reason."""
    from cnnpar.cli import main

    gone = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    typed = ["--out", str(tmp_path / "x"), "--out-dir", str(tmp_path / "d"), "--lr", "0.1"]
    assert main(["bench", "--compare", *gone, *typed]) == 2
    notes = [line[len(NOTE) :] for line in capsys.readouterr().err.splitlines() if line.startswith(NOTE)]
    assert notes == [
        "--lr 0.1 not used: cnnpar bench --compare sets two bench tables already written side by side, training "
        "nothing: it applies to cnnpar train",
        f"--out-dir {tmp_path / 'd'} not used: cnnpar bench --compare writes compare.md into --out; --out-dir places "
        "it only without --out",
    ]


def test_config_flags_typed_for_bench_claims_are_named_but_those_it_reads(capsys):
    """`cnnpar bench --claims --lr 0.5 --precision fp16 --batch-size 64` measured every claim on its own workload
    and defaults and said nothing of the three: each claim builds its own config (bench/claims.ClaimContext.config).
    The settings it does read (--device, --seed, --workers, --out-dir) get no note; --preset claims is the same."""
    from cnnpar.cli import main

    why = (
        "not used: cnnpar bench --claims measures each claim on the workload and settings the claim names (its own "
        "model, synthetic images, batch, precision and compile), reading of the config only --device, --seed, "
        "--workers and --out-dir: it applies to a ladder (cnnpar bench) and cnnpar train"
    )
    typed = ["--lr", "0.5", "--precision", "fp16", "--batch-size", "64", "--seed", "3", "--workers", "2"]
    for mode in (["--claims"], ["--preset", "claims"]):
        assert main(["bench", *mode, "--only", "warp_drive", "--device", "cpu", *typed]) == 2
        err = capsys.readouterr().err.splitlines()
        notes = [line[len(NOTE) :] for line in err if line.startswith(NOTE)]
        assert notes == [f"--lr 0.5 {why}", f"--precision fp16 {why}", f"--batch-size 64 {why}"]
        assert "warp_drive" in err[-1]  # the bad --only still stops it, after the notes


def test_only_the_name_typed_for_doctor_is_named_and_none_for_tune(capsys):
    """`cnnpar doctor` advises `cnnpar train` lines that carry every setting but --name (doctor/run.advice_command),
    and samples telemetry with --monitor; `cnnpar tune` writes every setting into tuned.toml."""
    why = (
        "not used: cnnpar doctor writes its report to --report-dir, and the train commands it advises leave --name "
        "out (a folder that holds a run is refused): it applies to cnnpar train"
    )
    assert _notes(capsys, *RUN_TYPED, command="doctor") == [f"--name x {why}"]
    assert _notes(capsys, *RUN_TYPED, command="tune") == []
