"""`cnnpar profile`: the training loop for a bounded number of steps under torch.profiler.

Runs under torchrun too: every rank profiles its own steps and writes trace_rank{R}.json.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from cnnpar.config import Config, dumps_toml
from cnnpar.dist import DistInfo, barrier, broadcast_object
from cnnpar.doctor.options import ProfileOptions
from cnnpar.engine.harness import build_trainer, next_group, run_step, training_batches
from cnnpar.engine.memory_full import TRAINING_WAYS, memory_full_said
from cnnpar.report.environment import comment_lines, environment
from cnnpar.report.files import check_output_folder, output_folder, write_errors_explained, write_text_atomic
from cnnpar.report.profiler import NOT_WRITTEN, RANK_FILES, ProfileFiles, profile_steps
from cnnpar.report.ranges import DATA_WAIT, span

# every rank's files, and rank 0's config.toml: an earlier profile's results in a --report-dir
PROFILE_FILES = (*(name.format(rank="*") for name in RANK_FILES), "config.toml")


def run_profile(cfg: Config, info: DistInfo, opts: ProfileOptions) -> ProfileFiles:
    # before the trainer is built
    check_output_folder("profile", "--report-dir", opts.report_dir, cfg.run.out_dir, PROFILE_FILES)
    trainer = build_trainer(cfg, info)
    # Rank 0 makes the folder (without --report-dir a new one under run.out_dir, runs/ by default and git-ignored,
    # not the current folder) before the broadcast lets any rank write there, and removes it if the steps fail (data
    # that fails at its first batch, a file that cannot be written): no empty or partial report folder is left behind
    # (in a --report-dir that was there, the files it wrote are removed: a re-run into it is not refused)
    parent = Path(cfg.run.out_dir) / "profile"
    held = (
        output_folder(opts.report_dir, parent, cfg.model.name, results=PROFILE_FILES)
        if info.is_main
        else contextlib.nullcontext("")
    )
    with held as made:
        out = Path(broadcast_object(str(made), info))
        return _profile(trainer, info, opts, out)


def _profile(trainer, info: DistInfo, opts: ProfileOptions, out: Path) -> ProfileFiles:
    batches = training_batches(trainer)
    trainer.model.train()

    def step(i: int) -> None:
        with span(DATA_WAIT):
            group = next_group(trainer, batches)
        run_step(trainer, group)

    batch, shape = trainer.cfg.run.batch_size, trainer.bundle.shape
    try:
        with memory_full_said("the training step", batch, shape, info.device, TRAINING_WAYS):
            files = profile_steps(
                step,
                out,
                info.rank,
                info.device.type == "cuda",
                opts.wait,
                opts.warmup,
                opts.active,
                opts.row_limit,
                opts.all_threads,
            )
    finally:
        batches.close()
        trainer.close()
    if info.is_main:  # what was profiled, on what: the tables and traces beside it carry no such record
        env = environment(info.device, info.world_size)
        header = comment_lines(env)
        with write_errors_explained(out / "config.toml", NOT_WRITTEN):
            write_text_atomic(
                out / "config.toml", header + "# profiled by `cnnpar profile`\n" + dumps_toml(trainer.cfg)
            )
    barrier(info)
    return files
