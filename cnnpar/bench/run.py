"""`cnnpar bench`: pick the mode (ladder, claims, time-to-accuracy, compare), run it, write its files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cnnpar.config import Config
from cnnpar.report.files import write_text_atomic

from .timing import Timing


@dataclass(frozen=True)
class BenchOptions:
    mode: str  # "ladder", "claims", "tta" or "compare"
    out: str = ""  # results folder ("" -> <run.out_dir>/bench/<date>-<device>-<model>/)
    timing: Timing = Timing()
    only: str = ""  # comma-separated rung or claim names
    target: float = 0.0  # tta: validation accuracy to reach
    compare: tuple[str, str] = ("", "")
    ddp: str = ""  # ladder: also measure DDP at these world sizes ("1,2"), one torchrun launch each


def _ddp_rows(cfg: Config, opts: BenchOptions, out: Path, device_type: str, image_size: int) -> None:
    """DDP rows beside the ladder: the same model, image size and per-process batch at each world
    size, through cnnpar's Trainer and host input pipeline (see bench/ddp_scaling.py)."""
    from .ddp_scaling import main as ddp_main

    argv = [
        "--world-sizes",
        opts.ddp,
        "--device",
        device_type,
        "--model",
        cfg.model.name,
        "--image-size",
        str(image_size),
        "--batch-size",
        str(cfg.run.batch_size),
        "--steps",
        str(opts.timing.steps),
        "--repeats",
        str(opts.timing.repeats),
        "--out",
        str(out / "ddp"),
    ]
    try:
        ddp_main(argv)
    except SystemExit as e:  # a failed launch: the ladder's files are already written
        if e.code not in (0, None):
            print(f"bench: DDP rows failed: {e.code}", flush=True)


def _compare(cfg: Config, opts: BenchOptions) -> int:
    from .compare import compare_markdown, default_compare_path

    text = compare_markdown(*opts.compare)
    path = Path(opts.out) / "compare.md" if opts.out else default_compare_path(cfg.run.out_dir, *opts.compare)
    write_text_atomic(path, text)
    print(text, end="")
    print(f"wrote {path}")
    return 0


def _measurement_setup(cfg: Config, timing: Timing):
    """Device, data and the run metadata (peak FLOP/s and model FLOPs measured here, now)."""
    from cnnpar.data import load_data
    from cnnpar.dist import init_distributed

    from .flops import flops_per_image, peak_flops
    from .meta import run_metadata

    # One process by design: a bench started under torchrun still measures one device.
    info = init_distributed(cfg.speed.device, debug_single=True)
    bundle = load_data(cfg.data, cfg.run.seed)
    peak = peak_flops(info.device)
    fpi = flops_per_image(cfg.model.name, bundle.shape, bundle.num_classes, info.device)
    return info, bundle, run_metadata(cfg, bundle, info.device, timing, peak, fpi)


def _out_dir(opts: BenchOptions, info, cfg: Config) -> Path:
    from .meta import default_out_dir

    return Path(opts.out) if opts.out else default_out_dir(cfg.run.out_dir, info.device, cfg.model.name)


def run_bench(cfg: Config, opts: BenchOptions) -> int:
    if opts.mode == "compare":
        return _compare(cfg, opts)
    import torch

    from . import output
    from .claims import CLAIM_IDS, run_claims
    from .ladder import RUNG_NAMES, parse_only, run_ladder
    from .tta import check_target, run_tta

    # Bad flags fail before any data is loaded or anything is measured.
    if opts.mode == "tta":
        check_target(opts.target)
    only = (
        parse_only(opts.only, CLAIM_IDS, "claim")
        if opts.mode == "claims"
        else parse_only(opts.only, RUNG_NAMES, "rung")
    )
    info, bundle, meta = _measurement_setup(cfg, opts.timing)
    out = _out_dir(opts, info, cfg)
    print(
        f"bench: {cfg.model.name} on {bundle.origin} ({meta['image_shape']}), batch {cfg.run.batch_size}, "
        f"{meta['device']} ({info.device.type}), torch {torch.__version__}; peak {meta['peak_tflops']} TFLOP/s "
        f"({meta['peak_kind']}); {meta['gflops_per_image']} GFLOP/image",
        flush=True,
    )
    log = lambda text: print(text, flush=True)  # noqa: E731
    if opts.mode == "claims":
        files = output.write_claims(out, run_claims(cfg, bundle, info, opts.timing, meta, only, log))
    elif opts.mode == "tta":
        files = output.write_tta(out, run_tta(cfg, bundle, info, opts.target, opts.timing.repeats, meta, log))
    else:
        files = output.write_ladder(out, run_ladder(cfg, bundle, info, opts.timing, meta, only, log))
    print(files[1].read_text(), end="")
    print("wrote " + ", ".join(str(f) for f in files))
    if opts.ddp and opts.mode == "ladder":
        _ddp_rows(cfg, opts, out, info.device.type, bundle.shape[1])
    return 0
