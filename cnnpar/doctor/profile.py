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
from cnnpar.report.environment import comment_lines, environment
from cnnpar.report.files import check_out_folder, removed_on_failure, stamped_folder, write_text_atomic
from cnnpar.report.profiler import ProfileFiles, profile_steps
from cnnpar.report.ranges import DATA_WAIT, span


def run_profile(cfg: Config, info: DistInfo, opts: ProfileOptions) -> ProfileFiles:
    # Under run.out_dir (runs/ by default, git-ignored) like every other output, not the current folder.
    default = stamped_folder(Path(cfg.run.out_dir) / "profile", cfg.model.name)
    decided = Path(opts.report_dir) if opts.report_dir else default
    check_out_folder(decided, "--report-dir" if opts.report_dir else "--out-dir")  # before the trainer is built
    trainer = build_trainer(cfg, info)
    # rank 0 makes the folder before the broadcast lets any rank write there, and removes it if the
    # steps fail (data that fails at its first batch): no empty report folder is left behind
    with removed_on_failure(decided) if info.is_main else contextlib.nullcontext():
        out = Path(broadcast_object(str(decided), info))
        return _profile(trainer, info, opts, out)


def _profile(trainer, info: DistInfo, opts: ProfileOptions, out: Path) -> ProfileFiles:
    batches = training_batches(trainer)
    trainer.model.train()

    def step(i: int) -> None:
        with span(DATA_WAIT):
            group = next_group(trainer, batches)
        run_step(trainer, group)

    try:
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
        write_text_atomic(out / "config.toml", header + "# profiled by `cnnpar profile`\n" + dumps_toml(trainer.cfg))
    barrier(info)
    return files
