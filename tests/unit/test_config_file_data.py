"""A run's record (its config.toml) given back with `--config` chooses afresh what the run chose from its data, where
the data is not that run's: typed flags that make other images (`--image-shape`, `--synthetic-samples`, ...), or a
file changed behind the same path. Before, the record's image size and the batch capped to its few training samples
(with the lr scaled for that batch) trained on the new data, silently."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from cnnpar.config import Config

pytestmark = pytest.mark.usefixtures("one_thread")  # one intra-op thread for the in-process runs (conftest)

COMMON = ["--device", "cpu", "--workers", "0", "--epochs", "1", "--max-steps", "1", "--no-progress", "--no-tensorboard"]


def _parsed(*words: str) -> Config:
    from cnnpar.cli import build_parser
    from cnnpar.cliargs import config_from_args

    return config_from_args(build_parser().parse_args(["train", *words]))


def _train(out: Path, name: str, *words: str) -> dict:
    """The record of a one-step run `name` under `out`, as TOML."""
    from cnnpar.cli import main

    assert main(["train", *COMMON, "--out-dir", str(out), "--name", name, *words]) == 0
    return tomllib.loads((out / name / "config.toml").read_text())


def _chosen(record: dict) -> tuple:
    """What a run chose from its data: the image size, the batch and the lr that trained."""
    return record["data"]["image_size"], record["run"]["batch_size"], record["optim"]["lr"], record["optim"]["lr_batch"]


def test_a_record_re_run_with_flags_that_make_other_data_chooses_what_a_fresh_run_chooses(tmp_path):
    small = ["--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "40"]
    first = _train(tmp_path, "cap", *small)
    assert _chosen(first)[:2] == (8, 32)  # 32 training samples: the CPU's 64 capped to them, the lr scaled to 32
    record = str(tmp_path / "cap" / "config.toml")
    bigger = ["--synthetic-samples", "200", "--image-shape", "1x16x16"]
    again = _train(tmp_path, "cap2", "--config", record, *bigger)
    fresh = _train(tmp_path, "fresh", "--data", "synthetic", *bigger)
    assert _chosen(again) == _chosen(fresh) == (16, 64, 0.002, 64)
    # the run's own data, typed as it was asked for or as it resolved, is the same data: the record repeats itself
    same = _train(tmp_path, "same", "--config", record, *small, "--image-size", "8")
    assert _chosen(same) == _chosen(first)


def _write_csv(path: Path, side: int, rows: int) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (rows, side * side))
    header = "label," + ",".join(f"pixel{i}" for i in range(side * side))
    path.write_text("\n".join([header, *(f"{i % 10}," + ",".join(map(str, p)) for i, p in enumerate(pixels))]) + "\n")


def test_a_record_re_run_on_a_file_changed_behind_the_same_path_chooses_from_the_file_as_it_is_now(tmp_path):
    data = tmp_path / "d.csv"
    _write_csv(data, 8, 40)
    first = _train(tmp_path, "a", "--data", str(data))
    assert _chosen(first)[:2] == (8, 32)
    record = str(tmp_path / "a" / "config.toml")
    assert _chosen(_train(tmp_path, "same", "--config", record)) == _chosen(first)  # the same file: the same run
    _write_csv(data, 16, 100)
    again = _train(tmp_path, "b", "--config", record)
    fresh = _train(tmp_path, "fresh", "--data", str(data))
    assert _chosen(again) == _chosen(fresh) == (16, 64, 0.002, 64)


def _record(out: Path, name: str, requested: dict[str, tuple[str, str]], body: str, batch: int) -> str:
    """A run record `out/name/config.toml` of `batch`: `body` with the `# requested:` and `# resolved:` line pairs."""
    run = out / name
    run.mkdir()
    lines = "".join(f"# requested: {k} = {a}\n# resolved: {k} = {b}\n" for k, (a, b) in requested.items())
    (run / "config.toml").write_text(
        lines + body + f'[run]\nbatch_size = {batch}\nname = "{name}"\nout_dir = "{out.as_posix()}"\n'
    )
    return str(run / "config.toml")


def test_a_capped_fixed_batch_and_accumulation_go_back_to_what_was_asked_and_a_searched_batch_stays(tmp_path):
    """Only the cap lowers a fixed batch (and the lr's batch with it) or a --grad-accum: asked for again, the same
    data caps them alike. A GPU's searched batch stays with the same data, and is searched again with other data."""
    capped = _record(
        tmp_path,
        "cpu",
        {"run.batch_size": ("256", "32"), "optim.lr_batch": ("auto", "32"), "optim.grad_accum": ("8", "1")},
        '[data]\nsource = "synthetic"\nimage_shape = "1x8x8"\n[optim]\nlr_batch = 32\ngrad_accum = 1\n'
        '[speed]\ndevice = "cpu"\n',
        batch=32,
    )
    cfg = _parsed("--config", capped)
    assert (cfg.run.batch_size, cfg.optim.lr_batch, cfg.optim.grad_accum) == (256, 0, 8)
    searched = _record(
        tmp_path,
        "gpu",
        {"run.batch_size": ("auto", "48"), "optim.lr": ("0.002", "0.00173"), "speed.device": ("'auto'", "'cuda'")},
        '[data]\nsource = "synthetic"\nimage_shape = "1x8x8"\nsynthetic_samples = 40\n[optim]\nlr = 0.00173\n'
        '[speed]\ndevice = "cuda"\n',
        batch=48,
    )
    same = _parsed("--config", searched, "--image-shape", "1x8x8", "--synthetic-samples", "40")
    assert (same.run.batch_size, same.optim.lr) == (48, 0.00173)
    other = _parsed("--config", searched, "--synthetic-samples", "4000")
    assert (other.run.batch_size, other.optim.lr) == (0, 0.002)
    typed = _parsed("--config", searched, "--synthetic-samples", "4000", "--batch-size", "48")
    assert (typed.run.batch_size, typed.optim.lr) == (48, 0.00173)  # a fixed batch: the lr it trained at stands
