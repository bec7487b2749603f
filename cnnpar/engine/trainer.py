"""The trainer owns set-up order and the loop.

Set-up order: data first (bad input fails before any folder is made), then the device-resolved
config, model, parallel wrappers, optimizer, schedule, loaders, the train step; the run folder
last. The ranks compare their settings and data before DDP wraps the model, and the checkpoint
once it is loaded (engine/agreement.py), so that ranks that would train different models stop.
The epoch loop groups the loader's batches into accumulation groups and hands each to the
`TrainStep` (engine/train_step.py), the one step every tool times too. The loop keeps host syncs
to the places that read numbers: the progress display, the end of an epoch and evaluation.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from cnnpar.config import (
    Config,
    asked_lr,
    batch_lr_factor,
    default_lr_note,
    dumps_toml,
    speed_reasons,
    to_dict,
)
from cnnpar.console import rate_text, say_stop_line
from cnnpar.data import DataBundle, load_data
from cnnpar.data.bundle import class_lines, split_line
from cnnpar.data.gpu_decode import GpuDecoder
from cnnpar.data.loader import build_loader, decode_line, decodes_on_gpu, workers_cap_line
from cnnpar.data.sources import folder_content_sample, long_read_line
from cnnpar.data.transforms import mirror_warning, resolve_augment, tta_mirror_warning
from cnnpar.data.worker_crash import worker_crash
from cnnpar.dist import DistInfo, all_reduce_sum, barrier, debug_switch_cut, device_queues_line, launched_nproc
from cnnpar.engine.agreement import data_identity, refuse_disagreeing_ranks, shared_settings, weights_checksum
from cnnpar.engine.averaging import module_weights
from cnnpar.engine.batch_size import lr_line, search_on_device
from cnnpar.engine.checkpoint import (
    BEST,
    LAST,
    best_state,
    checkpoint_epoch,
    kept_after_failed_write,
    load_checkpoint,
    load_model_weights,
    optimizer_state_problem,
    refuse_nonfinite,
    require_average,
    require_training_state,
    save_checkpoint,
)
from cnnpar.engine.data_identity import data_location
from cnnpar.engine.divergence import DivergenceCheck
from cnnpar.engine.fault import maybe_inject_fault
from cnnpar.engine.memory_full import EVALUATION_WAYS, TRAINING_WAYS, memory_full_said
from cnnpar.engine.optim import (
    apply_frozen_whitening,
    bias_to_freeze,
    build_optimizer,
    describe_lr,
    last_step_lr,
    rebuild_after_resume,
    scaled_lr,
    set_bias_trains,
    warmup_steps,
)
from cnnpar.engine.resolved import (
    data_resolved,
    kept_requested_lines,
    long_compiles_resolved,
    requested_lines,
    size_from_checkpoint,
    started_in_line,
)
from cnnpar.engine.resume_checks import ResumeChecks, record_resumes
from cnnpar.engine.rng import RNG_SCHEME, earlier_scheme_note, epoch_seed, init_epoch_rng
from cnnpar.engine.rundir import (
    kept_line,
    named_by_its_stamp,
    resolve_run,
    restarts_cannot_find_run,
    resume_auto_record,
    resume_unseen_here,
    run_folder_held,
    stopped_line,
)
from cnnpar.engine.step import eval_batch
from cnnpar.engine.stops import close_batches, closing_feeders, the_stop
from cnnpar.engine.train_step import build_step_parts, build_train_step, graphs_blocked_by
from cnnpar.errors import (
    ConfigError,
    DataError,
    DeviceMemoryFull,
    OutputNotWritable,
    UserError,
    raise_pending_stop,
    user_error_text,
)
from cnnpar.models import build_model
from cnnpar.models.registry import smallest_batchnorm_map
from cnnpar.parallel import parallelize, resolve_for
from cnnpar.parallel.apply import apply_stem_space_to_depth, unwrap
from cnnpar.parallel.precision import emulated_bf16_note
from cnnpar.parallel.stem import SpaceToDepthConv2d, stem_line
from cnnpar.parallel.streams import TrainingStream
from cnnpar.report.environment import comment_lines, cpu_threads_note, environment
from cnnpar.report.files import (
    TEXT,
    read_csv,
    remove_orphan_temps,
    write_csv_atomic,
    write_errors_explained,
    write_json_atomic,
    write_text_atomic,
)
from cnnpar.report.heartbeat import Heartbeat, bar_left_out
from cnnpar.report.meters import DataWait, EpochClock, peak_memory, sync
from cnnpar.report.telemetry import monitor_run
from cnnpar.report.tensorboard import Board, open_board

# what the run folder holds beside its checkpoints, each written atomically by rank 0
RUN_RECORDS = ("config.toml", "metrics.csv", "summary.json", "resumes.csv")
METRIC_COLUMNS = [
    "epoch",
    "train_loss",
    "train_acc",
    "val_loss",
    "val_acc",
    "lr",
    "epoch_s",
    "images_per_s",
    "data_wait_share",
    "peak_mem_mb",
    "peak_mem_kind",
    "skipped_steps",
    "eval_s",
    "eval_wait_s",
]  # the checkpoint's seconds are not a column: the summary sums them
# the optim settings that decide the optimizer's parameter groups (engine/optim.py build_optimizer), by being on or
# off: a resume that turns one over cannot load its checkpoint's optimizer state
GROUPING_SETTINGS = ("whiten_bias_epochs", "whiten_frozen")
PROGRESS_EVERY = 20  # steps between progress-bar loss readouts (each one is a host sync)
PROBE_IMAGES = 8  # images of an unevaluated epoch's last batch whose outputs check its last update (check_diverged)
# The errors that, after a saved epoch, end with what the checkpoint holds and the command that continues (a file
# refused, stdout unwritable, out of memory: Trainer._raise_kept), where others (a divergence, a failed write) say
# what is kept in their own words. Rank 0 alone reads the checkpoint: another rank's line leaves it to its launcher.
SAID_WITH_WHAT_IS_KEPT = (DataError, OutputNotWritable, DeviceMemoryFull)


@dataclass
class TrainResult:
    run_dir: Path | None
    history: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def smoothed_loss_line(smoothing: float, classes: int) -> str:
    """What the two loss columns measure under label smoothing: they read as comparable, and are not."""
    right, other = 1 - smoothing + smoothing / classes, smoothing / classes
    floor = -right * math.log(right) - (classes - 1) * other * math.log(other)  # the smoothed targets' entropy
    return (
        f"loss: train loss is the label-smoothed cross-entropy (--label-smoothing {smoothing:g}; {floor:.2f} at "
        f"best with {classes} classes, even when every prediction is right), val loss the plain cross-entropy"
    )


def broadcast_buffers(model: torch.nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's BatchNorm statistics: each rank updated its own running stats on
    its own last batch, so without this ranks would evaluate (and save) slightly different models."""
    if info.distributed and info.collectives is not None:
        info.collectives.broadcast_buffers(model)
    elif info.distributed:
        for b in model.buffers():
            dist.broadcast(b, src=0)


def train_share(samples: int, world_size: int) -> int:
    """The training samples one process draws per epoch: the train loader's DistributedSampler cuts the ranks'
    shares to equal length, or pads a set smaller than the world to one each (data/loader.build_loader)."""
    return samples // world_size if samples >= world_size else 1


def left_out_note(samples: int, world_size: int, batch: int) -> str:
    """A note on the training samples each epoch leaves out, where they are 10% or more ("" otherwise): every
    process's last partial batch (dropped), and the fewer than world-size samples that the sampler cuts to give the
    ranks equal shares (3 over 2 processes trained 2 a epoch)."""
    share = train_share(samples, world_size)
    steps = share // batch
    left = max(0, samples - world_size * steps * batch)  # a set smaller than the world is padded: none left
    if left * 10 < samples:
        return ""
    why = ["the last partial batch is dropped"] if share % batch else []
    if samples > world_size * share:
        why.append(f"the {world_size} processes' shares are cut to equal length")
    of_all = f" (of {samples:,})" if world_size > 1 else ""
    return (
        f"batch {batch} of this process's {share:,}{of_all} training samples: {steps} step(s) per epoch, {left:,} "
        f"samples ({100 * left / samples:.0f}%) left out of each epoch ({'; '.join(why)}; other samples each epoch)"
    )


class Trainer(DivergenceCheck):
    def __init__(
        self,
        cfg: Config,
        info: DistInfo,
        bundle: DataBundle | None = None,
        log=print,
        settings_from: str = "",
        set_aside_lr: str = "",
    ) -> None:
        """`settings_from`: the text of the config.toml `cfg` was read from (`--config`), whose `# requested:`
        lines this run's record keeps where it kept the value, as a resume keeps its own record's. `set_aside_lr`:
        the preset's lr that --lr auto replaced, for the lr line (cliargs.preset_lr_set_aside)."""
        self.settings_from = settings_from
        self.set_aside_lr = set_aside_lr
        self.info = info
        self.log = log if info.is_main else (lambda *a, **k: None)
        if bundle is None and (reading := long_read_line(cfg.data)):
            self.log(reading)  # before a read of seconds to minutes, which said nothing
            sys.stdout.flush()  # into a log file now, not after the read
        # rank 0's folder scan says how far it is where it takes long (--no-progress: no such lines, as for the epoch)
        scan_say = self.log if info.is_main and cfg.run.progress else None
        self.bundle = bundle if bundle is not None else self._load_data_with_the_other_ranks(cfg, info, scan_say)
        self.decode_line = decode_line(cfg, self.bundle, info)
        self.graphs_requested = cfg.speed.cuda_graphs  # "auto" may yield to a GPU JPEG decoder below
        self.requested_cfg = cfg  # what the user asked for, written beside the resolved values
        self.cfg = cfg = resolve_for(cfg, info.device)
        self.batch_line = ""  # how --batch-size auto resolved (a search's, the CPU's 64) or a cap: _cap_batch_size
        # auto resolved to a fixed batch here (config.resolve_batch_size: the CPU's 64), not searched below
        self.cpu_auto_batch = cfg.run.batch_size != 0 and self.requested_cfg.run.batch_size == 0
        torch.backends.cudnn.benchmark = cfg.speed.cudnn_benchmark
        torch.manual_seed(cfg.run.seed)  # the same initial weights on every rank (DDP broadcasts them anyway)
        c, h, w = self.bundle.shape
        self.meta = {
            "model": cfg.model.name,
            "in_channels": c,
            "image_size": h,
            "num_classes": self.bundle.num_classes,
            "mean": list(self.bundle.mean),
            "std": list(self.bundle.std),
            "class_names": list(self.bundle.class_names),
            "image_shape": list(self.bundle.shape),
            # the labelled examples the split was drawn from: with the class names, what tells a resume that the
            # data under the same path changed (ResumeChecks.refuse_changed_data)
            "examples": len(self.bundle.train) + (len(self.bundle.val) if self.bundle.val is not None else 0),
            # where it was, and a store's pixel checksum: the same typed --data in another folder, or a store
            # prepared again with the same count, is other data (engine/data_identity.py)
            "data_path": data_location(cfg.data.source),
            "data_checksum": self.bundle.fingerprint,
        }
        if self.bundle.grey_from_pixels:  # what a resume resolves the checkpoint's --augment auto with
            self.meta["grey_from_pixels"] = True
        store = getattr(self.bundle.train, "store", None)
        if store is not None:
            # how `cnnpar prepare` resized the photos: predict on their folder resizes them so too, and scores the
            # pixels this run's validation scored (data/store_feed.PreparedFolder)
            self.meta["prepared_sides"] = {
                "max_side": int(store.header.get("max_side", 0)),
                "short_side": int(store.header.get("short_side", 0)),
            }
        refusal = None  # this model refused for these images or this batch: under DDP, said by the ranks together
        try:
            self.cfg = cfg = self._build_model(cfg)
        except UserError as e:
            refusal = e
        # before DDP wraps the model: a rank given another --model gets this line, not DDP's shape traceback
        same = {}
        if info.distributed:  # one process has no other rank to agree with
            val = len(self.bundle.val) if self.bundle.val is not None else 0
            sample = folder_content_sample(self.bundle)  # a folder's names pass for other photos under them
            same = {**shared_settings(cfg), **data_identity(self.meta, len(self.bundle.train), val, sample)}
        # every rank refused alike (one command line): the job's one refusal, said once (EveryRankRefused)
        refuse_disagreeing_ranks(same, info, "settings and data", refusal)
        self.model = parallelize(
            self.raw_model,
            info,
            sync_bn=cfg.dist.sync_bn,
            channels_last=cfg.speed.channels_last == "on",
            compile_mode=cfg.speed.compile,
            ddp_bucket_mb=cfg.dist.ddp_bucket_mb,
            ddp_static_graph=cfg.dist.ddp_static_graph,
            ddp_broadcast_buffers=cfg.dist.ddp_broadcast_buffers,
            compile_tuning=cfg.speed.compile_tuning == "on",
            compile_tiling=cfg.speed.compile_tiling == "on",
        )
        self.raw_model = unwrap(self.model)  # SyncBN conversion may have replaced the module
        # Identical weights came from the shared seed; from here on each rank draws its own random
        # numbers (dropout, DataLoader worker seeds, textbook augmentation): seed + rank.
        torch.manual_seed(cfg.run.seed + info.rank)
        ddp = getattr(self.model, "_orig_mod", self.model)
        self.ddp = ddp if isinstance(ddp, DDP) else None
        self.train_loader = build_loader(self.bundle, cfg, info, train=True)
        self.val_loader = build_loader(self.bundle, cfg, info, train=False) if self.bundle.val else None
        self.micro_steps = len(self.train_loader)
        self.accum_line = ""
        if cfg.optim.grad_accum > self.micro_steps:
            self.cfg = cfg = self._cap_accumulation(cfg)
        accum = cfg.optim.grad_accum
        self.max_steps_line = self._max_steps_line(cfg)
        if cfg.run.max_steps:
            self.micro_steps = min(self.micro_steps, cfg.run.max_steps * accum)
        self.steps_per_epoch = -(-self.micro_steps // accum)
        self.lr = scaled_lr(cfg.optim, info.world_size)
        self.optimizer = build_optimizer(self.raw_model, cfg.optim, self.lr, info.device)
        if cfg.dist.strategy == "horovod":
            from cnnpar.parallel.horovod import apply_horovod

            self.optimizer = apply_horovod(self.raw_model, self.optimizer, info, accum)
        total_steps = self.steps_per_epoch * cfg.run.epochs
        parts = build_step_parts(self.raw_model, self.optimizer, cfg, info.device, total_steps, self.steps_per_epoch)
        self.precision, self.scheduler, self.average = parts.precision, parts.scheduler, parts.average
        self.frozen_bias = bias_to_freeze(self.raw_model, cfg.optim, cfg.run.epochs, info.distributed)
        self.history: list[dict] = []
        self.start_epoch = 1
        # TensorBoard's x axis, the optimizer steps the run has taken, is the schedule's clock plus this offset:
        # a resume on another world size, batch or --grad-accum moves the clock to this run's steps per epoch
        # (_restore), while the steps already on the board were the earlier attempts' own
        self.board_offset = 0
        self.saved_epoch = 0  # the epoch ckpt/last.pt holds (rank 0's)
        self.last_batch: tuple[torch.Tensor, torch.Tensor] | None = None  # set by each epoch (_train_steps)
        self.best_saved_epoch = 0  # the epoch ckpt/best.pt holds (rank 0's; 0: none)
        self._t_start: float | None = None  # when this attempt's epochs began (each epoch's summary times them)
        self.nothing_to_do = ""  # set by _restore when the checkpoint already holds every epoch asked for
        self.resume_changes: list[dict] = []  # this resume's rows of resumes.csv (ResumeChecks.recorded_changes)
        self.stop_said = False  # fit printed the stop line (what is kept, how to go on): --nproc's launcher need not
        refusal = None  # this rank's own (its copy of the checkpoint unreadable, or of other data): said together
        # what the resume says ("resumed from ..."), held until the ranks agree on the checkpoint: said before a
        # refusal, it read as a resume that happened
        log, held = self.log, []
        self.log = lambda *a, **k: held.append((a, k))
        try:
            self.run_dir, resume_from = resolve_run(cfg, info)
            self.resumed_from = Path(resume_from) if resume_from is not None else None
            # read before this run rewrites the record: the image size line names where a resume's size came from
            record = self.run_dir / "config.toml"
            self.size_from_checkpoint = (
                resume_from is not None and record.is_file() and size_from_checkpoint(record.read_text(**TEXT))
            )
            if cfg.run.resume == "auto" and resume_from is None:  # a mistyped --name would otherwise start afresh
                if (self.run_dir / "config.toml").is_file():  # a run stopped in its first epoch: its settings stand
                    self.log(f"resume auto: {self.run_dir} has no finished epoch: starting it from epoch 1")
                else:
                    self.log(f"resume auto: no checkpoint in {self.run_dir}: a new run starts there")
            if resume_from is not None:
                self._restore(resume_from)
        except UserError as e:
            refusal = e
        finally:
            self.log = log
        # each node reads the checkpoint from its own disk, after DDP's broadcast of the weights: nothing else
        # would notice a node holding another copy of the run folder. A rank refused alone stops every rank
        # here, where the others waited in their first collective for it (--timeout-s).
        # the checksum reads every weight back to the host: only where another rank is there to compare with
        same = (
            {"epoch resumed from": self.saved_epoch, "weights checksum": weights_checksum(self.raw_model)}
            if info.distributed
            else {}
        )
        refuse_disagreeing_ranks(same, info, "checkpoint", refusal)  # one process: raises its own refusal alone
        for args, kwargs in held:
            self.log(*args, **kwargs)
        self.compile_s = 0.0
        self.eval_wait_s = 0.0  # the last evaluation's wait for its batches (evaluate)
        self.use_graphs = self._graphs_allowed()
        self.train_step = build_train_step(
            self.model, self.optimizer, parts, cfg, ddp=self.ddp, cuda_graphs=self.use_graphs
        )
        self.board = Board()  # writes nothing until fit opens the run's (bench and tune call train_epoch alone)
        # nvJPEG's streams block the default stream both ways: beside a GPU decoder the training thread works
        # on a stream of its own from here to close (parallel/streams.py). Entered last, so that a Trainer that
        # fails to build leaves the thread's stream as it was; what was queued before is waited for.
        self.stream = TrainingStream(info.device, decodes_on_gpu(cfg, self.bundle))
        self.stream.enter()

    def _build_model(self, cfg: Config) -> Config:
        """The model for this data (`raw_model`) and the config resolved with it (a batch searched or capped, the long
        compiles). Refused here, before the run folder (a start-up refusal leaves none): a model these images are
        too small for, a frozen whitening the data cannot set, BatchNorm on a batch of 1."""
        c, h, w = self.bundle.shape
        self.raw_model = build_model(cfg.model.name, c, self.bundle.num_classes, h, w)
        if hasattr(self.raw_model, "init_from_data"):
            self.raw_model.init_from_data(self._normalised_sample())
        apply_frozen_whitening(self.raw_model, cfg.optim)
        # before the batch-size search: it times this module, and the stem changes the step's speed and memory
        apply_stem_space_to_depth(self.raw_model, cfg.speed.stem_space_to_depth == "on")
        if cfg.run.batch_size == 0:  # --batch-size auto on a GPU: measured now, before the loaders need it
            self.cfg = cfg = self._choose_batch_size(cfg)
        self.cfg = cfg = self._cap_batch_size(cfg)
        self._refuse_batchnorm_of_one(cfg)
        cfg, self.long_compiles_line = long_compiles_resolved(cfg, len(self.bundle.train), self.info.world_size)
        return cfg

    @staticmethod
    def _load_data_with_the_other_ranks(cfg: Config, info: DistInfo, say=None) -> DataBundle:
        """The data, where every rank of a job stops together when one is refused before its settings can be
        compared: its own copy of the data unreadable (a bad row, an undecodable image), or its disk without the
        run folder a resume names (resume_unseen_here, resume_auto_record). A rank refused alone had left the
        others a gloo traceback (the peer's connection closed) in place of the cause, or, without the run's
        config.toml, a settings difference in a field nobody typed."""
        if not info.distributed:
            return load_data(cfg.data, cfg.run.seed, say)
        bundle, refusal = None, resume_unseen_here(cfg)
        if refusal is None:  # no data read for a run that cannot start
            try:
                bundle = load_data(cfg.data, cfg.run.seed, say)
            except UserError as e:
                refusal = e
        what = "run folder (--out-dir on a shared file system)"
        refuse_disagreeing_ranks(resume_auto_record(cfg), info, what, refusal)
        return bundle

    def _choose_batch_size(self, cfg: Config) -> Config:
        """The searched batch (engine/batch_size.py) and the lr scaled to it from the batch it is for (optim.lr_batch,
        resolved: 64, a preset's, a record's fixed batch) by its stated rule."""
        gpu_decoder = decodes_on_gpu(cfg, self.bundle)
        graphs = cfg.speed.cuda_graphs == "on" and not graphs_blocked_by(
            cfg, self.info.distributed, gpu_decoder and self.graphs_requested == "auto"
        )
        choice = search_on_device(
            self.raw_model,
            cfg,
            self.info,
            self.bundle.shape,
            self.bundle.num_classes,
            len(self.bundle.train),
            graphs,
            gpu_decoder=gpu_decoder,
        )
        lr = cfg.optim.lr * batch_lr_factor(cfg.optim.optimizer, choice.batch, cfg.optim.lr_batch)
        self.batch_line = (
            f"{choice.line()}; {lr_line(cfg.optim.optimizer, cfg.optim.lr, cfg.optim.lr_batch, choice.batch)}"
        )
        return replace(cfg, run=replace(cfg.run, batch_size=choice.batch), optim=replace(cfg.optim, lr=lr))

    def _cap_batch_size(self, cfg: Config) -> Config:
        """A batch larger than this process's share of the training split trains on the share: the loader keeps
        a last partial batch only where there is no full one (data/loader.build_loader), so every step ran the
        share while the start-up line and the run's config.toml said the batch asked for. It is capped to what
        runs, said in a line and stored so (the size asked for beside it, as a `# requested:` line); the lr is
        the one a batch of that size gets (a fixed batch trains at --lr, now the lr of the capped batch; the
        CPU's automatic 64 scales it as for 64). A batch that leaves a large remainder out of each epoch (the
        partial last batch is dropped, and the sampler cuts the ranks' shares to equal length) is said in
        `batch_note`."""
        self.batch_note = ""
        share = train_share(len(self.bundle.train), self.info.world_size)
        # the largest batch that runs here: the doctor keeps its advice within it rather than restating this rule
        self.batch_limit = share
        batch = self.batch_asked = cfg.run.batch_size  # before the cap: the doctor reports a split under one batch
        asked = self.requested_cfg
        optim = cfg.optim
        cpus = self.cpu_auto_batch
        if batch <= share:
            if cpus and optim.lr_batch != batch:  # the lr scaled to it from another batch (a preset's)
                line = lr_line(optim.optimizer, asked_lr(asked.optim), optim.lr_batch, batch)
                self.batch_line = f"batch size auto: {batch} (the CPU's); {line}"
            elif cpus:  # the choice said, as a GPU's search says its own (config.resolve_batch_size)
                self.batch_line = f"batch size auto: {batch} (the CPU's fixed size: a GPU's is searched, a CPU's not)"
            limit = cfg.run.max_steps * cfg.optim.grad_accum
            if not (limit and limit < share // batch):  # --max-steps leaves out more, on purpose
                self.batch_note = left_out_note(len(self.bundle.train), self.info.world_size, batch)
            return cfg
        whose = "this process's share of the" if self.info.world_size > 1 else "all"
        capped = f"capped to {share}: {whose} {len(self.bundle.train):,} training samples, one step per epoch"
        if asked.run.batch_size == 0:  # auto (the CPU's 64, a search's): the lr follows the batch that runs
            lr = asked_lr(asked.optim) * batch_lr_factor(optim.optimizer, share, optim.lr_batch)
            line = lr_line(optim.optimizer, asked_lr(asked.optim), optim.lr_batch, share)
            whence = " (the CPU's)" if cpus else ""
            self.batch_line = f"batch size auto: {batch}{whence}, {capped}; {line}"
            optim = replace(optim, lr=lr)
        else:
            self.batch_line = f"batch size {batch} {capped}"
            if asked.optim.lr_batch == 0:  # the lr was for the batch asked for, which is the one that trains
                optim = replace(optim, lr_batch=share)
        self.batch_note = left_out_note(len(self.bundle.train), self.info.world_size, share)  # the sampler's cut
        return replace(cfg, run=replace(cfg.run, batch_size=share), optim=optim)

    def _refuse_batchnorm_of_one(self, cfg: Config) -> None:
        """A batch of 1 per process where a BatchNorm layer sees 1x1 maps gives it one value per channel, which
        torch refuses in training, in the first step's traceback (resnet18 at 8x8 px, fastnet at 9). A batch of 2
        or more always holds two; SyncBatchNorm counts every rank's. A final partial batch is never that 1: the
        loader drops it where a full batch exists (data/loader.build_loader)."""
        if cfg.run.batch_size != 1 or (cfg.dist.sync_bn and self.info.world_size > 1):
            return
        found = smallest_batchnorm_map(self.raw_model, self.bundle.shape)
        if found is None or found[1] > 1:
            return
        layer, _, spatial = found
        _, h, w = self.bundle.shape
        maps = f"at {h}x{w} px reduces to 1x1 maps before" if spatial else "has"
        larger = ", or a larger --image-size" if spatial else ""
        share = train_share(len(self.bundle.train), self.info.world_size)
        if share == 1:  # the cap chose 1: no --batch-size gives more
            n = len(self.bundle.train)
            whose = f"this process's share of the {n:,} training samples is 1" if n > 1 else "1 training sample"
            fix = f"{whose}: use more training data{', fewer processes' if self.info.world_size > 1 else ''}{larger}"
        else:
            fix = f"give --batch-size 2 or more{larger}"
        raise ConfigError(
            f"model {cfg.model.name} {maps} a BatchNorm layer ({layer}), which cannot train on a batch of 1 per "
            f"process (one value per channel): {fix}"
        )

    def _cap_accumulation(self, cfg: Config) -> Config:
        """--grad-accum larger than an epoch's micro-batches: a step never takes micro-batches from two epochs,
        so each step accumulated the whole epoch's while the start-up line, the lr's linear rule and the record
        said the count asked for. It is capped to what runs, said, and stored so (a `# requested:` line beside)."""
        n = self.micro_steps
        self.accum_line = (
            f"--grad-accum {cfg.optim.grad_accum} capped to {n}: an epoch has {n} micro-batch(es) of "
            f"{cfg.run.batch_size} per process, and a step does not carry gradients into the next epoch"
        )
        return replace(cfg, optim=replace(cfg.optim, grad_accum=n))

    def _max_steps_line(self, cfg: Config) -> str:
        """A --max-steps past an epoch's optimizer steps stops nothing: said, as it counts each epoch's steps, where
        other trainers' max_steps counts the run's (a --max-steps 300 of 6 epochs of 22 steps trains 132)."""
        steps = -(-self.micro_steps // cfg.optim.grad_accum)
        if cfg.run.max_steps <= steps:
            return ""
        return (
            f"--max-steps {cfg.run.max_steps} stops nothing: an epoch has {steps} optimizer step(s), all of them run "
            f"({cfg.run.epochs} epoch(s): {steps * cfg.run.epochs} steps); it limits each epoch, not the run"
        )

    def graphs_blocked_reason(self) -> str:
        """Why cnnpar's CUDA graphs cannot replay this run's step, whatever the switch says ("" when they
        can): the one place that asks, for this run and for the doctor's advice."""
        # the loader exists here: ask it what it built (the batch search, earlier, asks decodes_on_gpu)
        gpu_decoder = self.graphs_requested == "auto" and isinstance(self.train_loader.decoder, GpuDecoder)
        return graphs_blocked_by(self.cfg, self.info.distributed, gpu_decoder)

    def _graphs_allowed(self) -> bool:
        if self.cfg.speed.cuda_graphs != "on":
            return False
        why = self.graphs_blocked_reason()
        if why:
            self.log(f"cuda graphs off: {why}")
        return not why

    def _normalised_sample(self, n: int = 5000, patches: int = 5_000_000) -> torch.Tensor:
        """Training images as the model sees them, for data-dependent initialisation (fastnet's whitened
        stem): the first n of in-memory data; from a folder or store, n spread over the split (its files are
        in class order) and decoded to their centre view, at most about `patches` 2x2 patches in all (5,000
        CIFAR-sized images; ~100 at 224 px, where 5,000 would take tens of GB in float64)."""
        c, h, w = self.bundle.shape
        n = min(n, len(self.bundle.train), max(1, patches // max(1, (h - 1) * (w - 1))))
        if self.bundle.in_memory:
            x = self.bundle.train.x[:n]
        else:
            picks = torch.linspace(0, len(self.bundle.train) - 1, n).round().long().unique().tolist()
            x = torch.stack([self.bundle.train[i][0] for i in picks])
        x = x.float().div_(255)
        mean = torch.tensor(self.bundle.mean).view(1, -1, 1, 1)
        std = torch.tensor(self.bundle.std).view(1, -1, 1, 1)
        return (x - mean) / std

    def board_step(self) -> int:
        """Optimizer steps taken so far, by this run and the attempts it resumes: TensorBoard's x axis."""
        return self.scheduler.last_epoch + self.board_offset

    # ---- checkpoints -------------------------------------------------------------------------
    def _state(self, epoch: int) -> dict:
        return {
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "precision": self.precision.state_dict(),
            **({"average": self.average.state_dict()} if self.average is not None else {}),
            "epoch": epoch,
            "rng": RNG_SCHEME,
            "history": self.history,
            "board_step": self.board_step(),
            "world_size": self.info.world_size,  # a resume under another count says so (resume_checks)
            "meta": self.meta,
            "config": to_dict(self.cfg),
            "started_in": os.getcwd(),  # what the config's relative data paths are relative to (a resume elsewhere)
        }

    def _restore(self, path: Path) -> None:
        state = require_training_state(load_checkpoint(path, map_location=self.info.device), path)
        checks = ResumeChecks(self.cfg, self.requested_cfg, self.bundle, self.meta, self.info.world_size, self.log)
        # before the weights: a changed image size or class order can still fit them, and would train on silently
        checks.refuse_changed_data(path, state.get("config", {}), state.get("meta", {}), state.get("started_in"))
        shape = "x".join(map(str, self.meta["image_shape"]))
        described = f"this run's {self.cfg.model.name} for {self.meta['num_classes']} classes of {shape} images"
        try:
            load_model_weights(self.raw_model, state["model"], path, described)
        except UserError:
            was = state.get("meta", {})
            if (was.get("model"), was.get("num_classes"), list(was.get("image_shape") or [])) == (
                self.cfg.model.name,
                self.meta["num_classes"],
                list(self.meta["image_shape"]),
            ):
                raise  # the run's own settings (an edited file): the line names the tensor that does not fit
            # the user needs what differs in the settings, not the first tensor it changed
            raise UserError(
                f"{path}: holds a {was.get('model')} for {was.get('num_classes')} classes of "
                f"{'x'.join(map(str, was.get('image_shape', [])))} images; this run has {self.cfg.model.name} for "
                f"{self.meta['num_classes']} classes of {'x'.join(map(str, self.meta['image_shape']))}: expected "
                + (
                    f"--model {was.get('model')} (or none)"
                    if was.get("model") and was.get("model") != self.cfg.model.name
                    else "the run's own --data, --image-size and --num-classes (or none of them)"
                )
            ) from None
        checks.refuse_changed_fields(path, state.get("config", {}))
        refuse_nonfinite(state["model"], path)
        if self.average is not None and "average" in state:  # what the average loads below
            refuse_nonfinite(module_weights(require_average(state, path)), path, "weight average")
        names = {p: name for name, p in self.raw_model.named_parameters()}
        if problem := optimizer_state_problem(self.optimizer, state["optimizer"], names):
            raise UserError(
                f"{path}: its optimizer state does not fit this run's {self.cfg.model.name} ({problem}): expected "
                "a checkpoint written by this cnnpar's train for that model"
            )
        fresh = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as e:  # another parameter grouping (whitening, Muon's split) than the checkpoint's run
            raise UserError(
                f"{path}: its optimizer state does not fit this run's parameter groups ({e}): "
                + self._regrouped(state.get("config", {}).get("optim", {}))
            ) from None
        for group, settings in zip(self.optimizer.param_groups, fresh):
            group.update(settings)  # this run's --weight-decay, --momentum, ... stand; the lr is set below
        peaks = list(self.scheduler.base_lrs)  # this run's peak lrs (--lr-scaling by this run's processes)
        self.scheduler.load_state_dict(state["scheduler"])
        finished = self.saved_epoch = int(state["epoch"])
        steps_before = self.scheduler.last_epoch
        # The schedule's clock is the optimizer steps done. Another world size, batch or --grad-accum than the
        # checkpoint's run changes the steps an epoch takes: the finished epochs are then finished * this run's
        # steps per epoch into the rebuilt schedule, not the old run's step count (which would put the lr, and the
        # weight average's clock, at another point of the run than its epochs).
        self.scheduler.last_epoch = finished * self.steps_per_epoch
        self.board_offset = int(state.get("board_step", steps_before)) - self.scheduler.last_epoch
        self.scheduler.base_lrs = peaks
        lrs = rebuild_after_resume(self.scheduler, self.optimizer)
        self.history = [row for row in state["history"] if row["epoch"] <= state["epoch"]]
        self.start_epoch = finished + 1
        self.precision.load_state_dict(state["precision"])
        if self.average is not None and "average" in state:
            load_model_weights(self.average.averaged, state["average"], path, described, "weight average")
        self._keep_best_of(state, path)  # once every part has loaded: it may write best.pt from the checkpoint
        if finished >= self.cfg.run.epochs:
            # no epoch to train: fit says so once and leaves the run folder as it is; a schedule "rebuilt" for
            # fewer epochs than are done, or a resume that trains nothing, would only mislead
            self.nothing_to_do = (
                f"nothing to do: {path} holds {finished} epoch{'s' * (finished != 1)} and --epochs "
                f"{self.cfg.run.epochs} asks for no more (--epochs {finished + 1} or more trains on)"
            )
            return
        if finished and steps_before != self.scheduler.last_epoch:
            self.log(
                f"schedule: the checkpoint's run took {steps_before / finished:g} optimizer steps an epoch, this "
                f"one takes {self.steps_per_epoch} (processes, batch, --grad-accum or --max-steps differ): "
                f"epoch {finished + 1} starts at step {self.scheduler.last_epoch} of "
                f"{self.steps_per_epoch * self.cfg.run.epochs}, lr {lrs[0]:.3g} (peak {self.lr:g})"
            )
        self.log(f"resumed from {path} after epoch {state['epoch']}")
        changed = checks.changed_settings(state, self.scheduler.base_lrs, self.lr, self.average is not None)
        if changed:
            self.log(f"resume: changed since the checkpoint, from epoch {finished + 1} on: {changed}")
        self.resume_changes = checks.recorded_changes(state, finished + 1)
        if "rng" not in state:
            self.log(
                "note: this checkpoint stores no RNG state (written before per-epoch seeds): the resumed "
                "epochs draw other crops, flips and worker seeds than an uninterrupted run would have"
            )
        elif state["rng"] != RNG_SCHEME:
            self.log(earlier_scheme_note(state["rng"]))
        planned = int(state.get("config", {}).get("run", {}).get("epochs", self.cfg.run.epochs))
        total = self.steps_per_epoch * self.cfg.run.epochs
        warm = warmup_steps(total, self.cfg.optim.warmup)
        # the warm-up is a share of the rebuilt run's steps: more epochs can stretch it past the finished ones, and
        # the lr then drops below the peak they trained at, which a constant schedule otherwise never does (its last
        # warm-up step is at the peak already)
        in_warmup = self.scheduler.last_epoch < warm and lrs[0] < self.lr
        if planned != self.cfg.run.epochs and (self.cfg.optim.schedule != "constant" or in_warmup):
            self.log(
                f"schedule: {self.cfg.optim.schedule} rebuilt for {self.cfg.run.epochs} epochs (the run planned "
                f"{planned}): epoch {finished + 1} starts at lr {lrs[0]:.3g} (peak {self.lr:g})"
                + (
                    f", inside the warm-up (--warmup {self.cfg.optim.warmup:g} of {total} steps: the first {warm})"
                    if in_warmup
                    else ""
                )
            )

    def _regrouped(self, stored: dict) -> str:
        """What a resume refused for its optimizer state's parameter groups expected: the flags that set the grouping
        otherwise than the checkpoint's run (`stored`, its config's optim section), where one did; a resume with
        --whiten-bias-epochs given to a run started without it was refused naming neither."""
        flags = []
        for name in GROUPING_SETTINGS:
            was, now = stored.get(name), getattr(self.cfg.optim, name)
            if isinstance(was, type(now)) and bool(was) != bool(now):  # 2 or 3 epochs group as 1 does: only on/off
                dashed = name.replace("_", "-")
                flags.append(
                    [
                        f"--{'' if v else 'no-'}{dashed}" if isinstance(v, bool) else f"--{dashed} {v}"
                        for v in (was, now)
                    ]
                )
        if not flags:
            return "expected a checkpoint written by this cnnpar's train for this run's model"
        was, now = (" ".join(f[i] for f in flags) for i in (0, 1))
        return f"the run was started with {was}, this resume asks for {now}: expected {was} (or none), or a new run"

    def _prepare_run_dir(self) -> None:
        if self.info.is_main:
            (self.run_dir / "ckpt").mkdir(parents=True, exist_ok=True)
            # what a SIGKILL cut short in an earlier attempt's writes (this run holds the folder: none is live)
            # (best.pt's too: a whole checkpoint in size, left for good, as no later best.pt write removed it)
            ckpts = (self.run_dir / "ckpt" / LAST, self.run_dir / "ckpt" / BEST)
            for written in (*ckpts, *(self.run_dir / n for n in RUN_RECORDS)):
                remove_orphan_temps(written)
            header = comment_lines(self._environment()) + record_resumes(
                self.run_dir / "resumes.csv", self.saved_epoch, self.resume_changes, self._record_written, self.log
            )
            resolved = data_resolved(self.cfg, self.bundle, self.train_loader, self.use_graphs)
            # the processes that ran, not the --nproc asked for (the debug switch runs one; torchrun by hand, any);
            # the debug switch itself is how this one launch ran, not a setting of the run: kept, it made a later
            # `--resume --nproc 2` (or torchrun) of this record train one process, halving the global batch unsaid
            resolved = replace(resolved, dist=replace(resolved.dist, nproc=launched_nproc(), debug_single=False))
            lines = requested_lines(self.requested_cfg, resolved)
            record = self.run_dir / "config.toml"
            # a resume, or a record re-run with --config: what its first run asked for stays on record, or the
            # next --config of this record with other data would take those values as the user's own
            earlier = record.read_text(**TEXT) if record.is_file() else self.settings_from
            if earlier:
                lines += kept_requested_lines(earlier, self.requested_cfg, lines)
            header += "".join(line + "\n" for line in lines) + started_in_line() + "\n"
            with self._record_written(record):
                write_text_atomic(record, header + dumps_toml(resolved))
            # the summary of what the checkpoint holds, unfinished: an earlier attempt's ("finished": true at its
            # --epochs) stayed beside the newer metrics and checkpoints of an attempt stopped before its end
            if self.history:
                self._write_summary(self._summary(0.0, finished=False))
                # likewise a metrics.csv that an earlier attempt stopped in its checkpoint's writes: it held the
                # epochs the checkpoint held then, until this attempt finished one
                if self._metrics_stale():
                    self._write_metrics()
        barrier(self.info)

    def _record_written(self, path: Path) -> contextlib.AbstractContextManager:
        """A run record's write (rank 0): an OSError in it (a full disk, a read-only folder) as one line naming the
        file, why, and what the run folder keeps, as a checkpoint's (save_checkpoint); a UserError, so that a run
        failing so before any epoch is saved leaves no folder it made (`fit`), and the other ranks of a job end as
        they do on rank 0's checkpoint error. Its traceback had hidden that the epochs saved were safe."""
        return write_errors_explained(path, lambda e: kept_after_failed_write(path, e))

    def _write_summary(self, summary: dict) -> None:
        path = self.run_dir / "summary.json"
        with self._record_written(path):
            write_json_atomic(path, summary)

    def _write_metrics(self) -> None:
        path = self.run_dir / "metrics.csv"
        with self._record_written(path):
            write_csv_atomic(path, self.history, METRIC_COLUMNS)

    # ---- the loop ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the loaders' worker processes and free the decoders' outside resources, as `fit` does at
        its end: for the doctor, the profiler, the bench and the tuner, which drive a Trainer without
        `fit`. Left to the interpreter's exit, each persistent worker costs 5 s there (loader.shutdown_workers)."""
        self.close_loaders()
        self.stream.exit()

    def close_loaders(self) -> None:
        """Stop the loaders' workers and free their decoders (`close`, the training stream kept)."""
        with closing_feeders(self.train_loader, self.val_loader):
            pass

    def warm_up_compile(self) -> None:
        """Compile, and capture the CUDA graph, outside the timed epochs, without changing training
        (`TrainStep.rehearse` puts weights and BatchNorm buffers back; the capture does so itself)."""
        if self.cfg.speed.compile == "off" and not self.use_graphs:
            return
        t0 = time.perf_counter()
        x, y = next(iter(self.train_loader))
        # with a stem bias that stops training, both sets of trainable parameters (each recompiles)
        for trains in (False, True) if self.frozen_bias is not None else (None,):
            if trains is not None:
                set_bias_trains(self.frozen_bias, trains)  # begin_epoch sets it for each epoch
            if self.cfg.speed.compile != "off":
                self.train_step.rehearse(x, y)
            self.train_step.capture(x, y)  # else the first timed epoch pays for the capture
        sync(self.info.device)
        self.compile_s = time.perf_counter() - t0
        what = f"compiled ({self.cfg.speed.compile})" if self.cfg.speed.compile != "off" else "captured"
        self.log(f"{what} in {self.compile_s:.1f} s, outside the timed epochs")

    def begin_epoch(self, epoch: int) -> None:
        """Every generator this epoch draws from starts from (seed, rank, epoch), so a resumed run
        repeats the uninterrupted one bit for bit (engine/rng.py says why re-derived, not carried)."""
        seed = epoch_seed(self.cfg.run.seed, self.info.rank, epoch)
        init_epoch_rng(seed)
        self.train_loader.set_epoch(epoch, seed)  # a new permutation (and shard) every epoch
        if self.frozen_bias is not None:
            set_bias_trains(self.frozen_bias, epoch <= self.cfg.optim.whiten_bias_epochs)
        self.model.train()

    def train_epoch(self, epoch: int) -> dict:
        from tqdm.auto import tqdm

        cfg, info = self.cfg, self.info
        self.begin_epoch(epoch)
        clock = EpochClock(info.device)
        loss_sum = torch.zeros((), dtype=torch.float64, device=info.device)
        correct = torch.zeros((), dtype=torch.int64, device=info.device)
        bar = tqdm(
            total=self.micro_steps,
            desc=f"epoch {epoch}/{cfg.run.epochs}",
            leave=False,
            file=sys.stderr,
            # None: tqdm draws only on a terminal. Into a log file or a pipe its redraws arrive as
            # \r-separated fragments; the one plain line per epoch (self.log) is what a log needs.
            disable=None if info.is_main and cfg.run.progress else True,
            dynamic_ncols=True,
        )
        # a log file gets a line now and then in place of the bar: a long epoch said nothing until its end
        beat = Heartbeat(
            f"epoch {epoch}/{cfg.run.epochs}",
            self.micro_steps,
            "batches",
            self.log,
            bar_left_out(bar, info.is_main and cfg.run.progress),
        )
        it = iter(self.train_loader)
        try:
            self._train_steps(it, epoch, clock, loss_sum, correct, bar, beat)
        finally:
            close_batches(it)
            del it
        raise_pending_stop()  # one raised while the iterator's __del__ joined its workers was dropped there
        bar.close()
        sync(info.device)  # note: a CPU-GPU sync point, so the epoch time covers the device's work
        timing = clock.summary()
        if epoch < cfg.run.epochs and hasattr(self.train_loader, "prepare"):
            # the next epoch's pipeline starts filling now, beside the evaluation and the checkpoint
            # (DeviceFeeder.prepare), from the seeds it would get then; after the clock stopped, so
            # that this epoch's time holds none of its start
            self.train_loader.prepare(epoch + 1, epoch_seed(cfg.run.seed, info.rank, epoch + 1))
        totals = torch.tensor([loss_sum.item(), correct.item(), clock.images], dtype=torch.float64, device=info.device)
        all_reduce_sum(totals, info)
        loss_total, right_total, images = totals.tolist()  # one device read for the three
        return {
            "images": int(images),  # trained this epoch, all ranks
            "train_loss": loss_total / images,
            "train_acc": right_total / images,
            "epoch_s": timing["epoch_s"],
            "images_per_s": images / timing["epoch_s"],
            "data_wait_share": timing["data_wait_share"],
        }

    def _train_steps(
        self, it, epoch: int, clock: EpochClock, loss_sum: torch.Tensor, correct: torch.Tensor, bar, beat: Heartbeat
    ) -> None:
        """One epoch's steps from the batch iterator `it`; sums accumulate in place."""
        info, accum = self.info, self.cfg.optim.grad_accum
        done = 0  # micro-batches taken this epoch
        for step in range(self.steps_per_epoch):
            raise_pending_stop()  # a stop whose raise was dropped (errors.pending_stop): in the loader's start, say
            # One accumulation group: `accum` micro-batches, fewer in an epoch's last group
            # (TrainStep weights each by its real size).
            group = []
            for _ in range(min(accum, self.micro_steps - done)):
                with clock.data_wait.waiting():
                    x, y = next(it)
                clock.count(y.shape[0])
                maybe_inject_fault(epoch, done, self.micro_steps, info)  # test-only; see engine/fault.py
                group.append((x, y))
                done += 1
            loss, right = self.train_step(group)
            loss_sum += loss  # at once: a graph replay's outputs are overwritten by the next one
            correct += right
            bar.update(len(group))
            beat.update(done)
            if step % max(1, PROGRESS_EVERY // accum) == 0:
                self.board.note_loss(loss_sum, clock.images, self.board_step())
            if not bar.disable and step % max(1, PROGRESS_EVERY // accum) == 0:
                bar.set_postfix(loss=f"{loss_sum.item() / clock.images:.4f}")  # note: a CPU-GPU sync point
        # a few of the epoch's last images, for the outputs its last update gives (check_diverged): copied, as the
        # loader may reuse their memory for the next epoch's batches
        x, y = group[0]
        self.last_batch = (x[:PROBE_IMAGES].clone(), y[:PROBE_IMAGES].clone())

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Exact over all ranks: sums and counts all-reduced, each sample counted once."""
        if self.val_loader is None:
            return {}
        # The plain module, not the DDP wrapper: ranks may hold different numbers of eval batches
        # and DDP's forward can issue collectives that would then never pair up.
        model = self.average.eval_model() if self.average is not None else self.raw_model
        broadcast_buffers(self.raw_model, self.info)
        if model is not self.raw_model:
            broadcast_buffers(model, self.info)
        model.eval()
        if model is self.raw_model and self.cfg.speed.compile_eval and self.ddp is None:
            model = self.model  # the compiled module around the same weights
        tta = self.cfg.run.tta_in_effect
        sums = torch.zeros(3, dtype=torch.float64, device=self.info.device)
        # the evaluation's own data wait (its loader's start included), measured as the training's is; not a
        # DATA_WAIT range, which a profile reads as the train step's
        waited = DataWait(self.info.device, range_name=None)
        # evaluation has no bar, on a terminal either: 200,000 images said nothing for 186 s before the epoch line
        beat = Heartbeat(
            "evaluating", len(self.val_loader), "batches", self.log, self.info.is_main and self.cfg.run.progress
        )
        done = 0
        batches = iter(self.val_loader)
        try:
            while True:
                raise_pending_stop()
                with waited.waiting():
                    batch = next(batches, None)
                if batch is None:
                    break
                x, y = batch
                loss, right = eval_batch(model, x, y, self.precision, "flip" in tta, "translate" in tta)
                sums[0] += loss
                sums[1] += right
                sums[2] += y.shape[0]
                done += 1
                beat.update(done)
        finally:
            close_batches(batches)
            del batches
        raise_pending_stop()
        all_reduce_sum(sums, self.info)
        n = float(sums[2])  # note: a CPU-GPU sync point
        self.eval_wait_s = waited.seconds()  # a timing, not a metric: kept apart so that equal models evaluate equal
        return {"val_loss": float(sums[0]) / n, "val_acc": float(sums[1]) / n, "val_count": int(n)}

    def fit(self) -> TrainResult:
        if self.nothing_to_do:
            return self._finished_already()

        def before_any_epoch(e: BaseException) -> bool:
            # the epoch saved, not the history: epoch 1's row is in it while its checkpoint is written, and a
            # checkpoint that could not be written left a folder with no epoch in it
            return isinstance(e, UserError) and not self.saved_epoch

        # The run holds its folder for its life (another run under the name, or a resume of this one, is
        # refused meanwhile). Bad input found only once training runs (a corrupt image that a worker fails to
        # decode), or a file of the run that cannot be written (a full disk), removes the folders this call made
        # while they hold no saved epoch; a kill, a crash (kept to look into) or an error after a saved epoch keeps
        # them for --resume. Rank 0 alone makes them, so it alone removes them.
        # a default folder is made here under a name no other run took (-2 for a second run started within its
        # second): the "run folder" line comes after
        stamped = (
            self.cfg.model.name
            if named_by_its_stamp(self.cfg, self.resumed_from is not None, self.info.world_size)
            else ""
        )
        with run_folder_held(
            self.run_dir, self.resumed_from, self.saved_epoch, self.info, before_any_epoch, stamped
        ) as self.run_dir:
            self._prepare_run_dir()
            try:
                board = open_board(self.cfg.run.tensorboard, self.info, self.run_dir, self.board_step, self.log)
                with (  # both stopped on any exit
                    board as self.board,
                    monitor_run(self.cfg.run.monitor, self.info, self.run_dir, self.log, self.board.telemetry),
                    closing_feeders(self.train_loader, self.val_loader),
                ):
                    return self._train_all_epochs()
            except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (errors.Terminated): what is kept, and how to go on
                self._say_stopped()
                raise
            except Exception as e:  # the stop's doing (a worker it killed, torch broken under it: the_stop), or a crash
                stop = the_stop(e)
                if stop is None:
                    self._raise_worker_crash(e)
                    self._raise_kept(e)
                    raise
                self._say_stopped()
                raise stop from None
            finally:
                self.stream.exit()  # the caller's stream again, after the training's work

    def _raise_worker_crash(self, e: Exception) -> None:
        """A DataLoader worker killed by a signal other than a stop's, said in one line as bad data (a damaged
        photo crashes torchvision's decoders): torch's traceback named no file. A DataError, so that the run's
        folder goes where no epoch was saved, as for any file a decoder refuses; where one was, the line says what
        the checkpoint holds and the command that continues, as a stop's does (`stop_said`: the launcher of
        `--nproc` then does not say it again)."""
        crash = worker_crash(e, self.cfg.data.source, self.bundle, self.cfg.data.labels)
        if crash is None:
            return
        line = str(crash)
        saved = self._saved_epoch_now()
        if saved:
            line += f"; {kept_line(self.run_dir, saved, self._continue_command())}"
            self.stop_said = True
        raise DataError(line) from None

    def _raise_kept(self, e: Exception) -> None:
        """A file refused after an epoch was saved (every file was read in the first: the input changed under the
        run, a photo deleted or a store truncated), or stdout that cannot be written then (/dev/full), said with what
        the checkpoint holds and the command that continues, as a worker's crash and a stop's line are: the line
        named the file, or stdout, alone and left the user to guess the epochs lost (a stop line would have gone to
        that stdout). The same error kind, on stderr. Out of memory (DeviceMemoryFull) too, whose command continues
        with half the batch and twice the accumulation: the same batch per step, which a plain resume ran out of
        memory on again."""
        kind = next((k for k in SAID_WITH_WHAT_IS_KEPT if isinstance(e, k)), None)
        flags = self._fitting_flags() if kind is DeviceMemoryFull else ""
        if flags:  # for the launcher of --nproc, whose line continues where this rank's did not (cli.main)
            e.resume_flags = flags
        saved = self._saved_epoch_now() if kind else 0
        if saved:
            self.stop_said = True
            kept = kind(f"{user_error_text(e)}; {kept_line(self.run_dir, saved, self._continue_command() + flags)}")
            kept.resume_flags = flags
            raise kept from None

    def _fitting_flags(self) -> str:
        """What a resume after running out of memory adds: half the batch and twice the accumulation, the same batch
        per step; an odd batch's half rounded up, one image more per step, which the resume names ("global batch
        15 -> 16 per step"): a plain resume ran out of memory again ("" for a batch of 1, which has no half)."""
        batch, accum = self.cfg.run.batch_size, self.cfg.optim.grad_accum
        return f" --batch-size {(batch + 1) // 2} --grad-accum {2 * accum}" if batch > 1 else ""

    def _say_stopped(self) -> None:
        """The stop line, what is kept and how to go on; on stderr too where stdout's reader went away (`| head`,
        console.StopWhenGone), whose line went nowhere and left the run's folder unsaid."""
        if self.info.is_main:  # (another rank's log says nothing)
            say_stop_line(self._stopped_line(), self.log)
        self.stop_said = True

    def _stopped_line(self) -> str:
        return stopped_line(self.run_dir, self._saved_epoch_now(), self._continue_command())

    def _continue_command(self) -> str:
        run_dir = shlex.quote(str(self.run_dir))  # pasted as it stands: a folder may hold spaces or quotes
        again = f"cnnpar train --resume {run_dir}"
        if self.cfg.dist.strategy == "horovod":
            again = f"your horovodrun command with --resume {run_dir}"
        elif self.info.world_size > 1:  # on one machine --nproc starts as many again; on several, each node's launch
            one_node = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) == self.info.world_size
            again += f" --nproc {self.info.world_size}" if one_node else " in each node's launch command"
        return again

    def _saved_epoch_now(self) -> int:
        # rank 0 reads its checkpoint: a stop landing in save_checkpoint after the rename (in the folder's fsync), or
        # just after it returned, left saved_epoch one short of what ckpt/last.pt holds. Another rank's saved_epoch is
        # the epoch it resumed from, stale once rank 0 saved another: 0, its line leaves what is kept to the launcher
        return max(self.saved_epoch, checkpoint_epoch(self.run_dir)) if self.info.is_main else 0

    def _train_all_epochs(self) -> TrainResult:
        cfg, info = self.cfg, self.info
        global_batch = cfg.run.batch_size * info.world_size * cfg.optim.grad_accum
        self.log(
            f"cnnpar: {cfg.model.name} on {self.bundle.origin} | {info.world_size} process(es) on "
            f"{info.device.type}{cpu_threads_note(info.device)} | {cfg.speed.precision}, channels_last "
            f"{cfg.speed.channels_last}, "
            f"compile {cfg.speed.compile}{', SyncBatchNorm' if cfg.dist.sync_bn and info.distributed else ''}"
        )
        if reasons := speed_reasons(self.requested_cfg, cfg, info.device.type):
            self.log(f"speed: {reasons}")
        if note := emulated_bf16_note(cfg.speed.precision, info.device):
            self.log(note)
        lr_note = default_lr_note(self.requested_cfg.optim, cfg.optim, self.set_aside_lr)
        self.log(
            f"batch {cfg.run.batch_size}/process x {info.world_size} process(es) x {cfg.optim.grad_accum} "
            f"accumulation = {global_batch} per step; "
            f"{describe_lr(cfg.optim, info.world_size, lr_note)}"
        )
        cut, asked = debug_switch_cut(self.requested_cfg.dist.debug_single, self.requested_cfg.dist.nproc)
        if cut:  # what the launch asked for against what trains
            lr = scaled_lr(cfg.optim, asked)
            lr_asked = (
                f" (lr {self.lr:g} instead of {lr:g}: --lr-scaling {cfg.optim.lr_scaling})" if lr != self.lr else ""
            )
            self.log(f"{cut}: global batch {global_batch} per step instead of {global_batch * asked}{lr_asked}")
        if self.batch_line:
            self.log(self.batch_line)
        if self.batch_note:
            self.log(self.batch_note)
        if self.accum_line:
            self.log(self.accum_line)
        if self.max_steps_line:
            self.log(self.max_steps_line)
        if getattr(self.train_loader.loader, "num_workers", 0) and (line := workers_cap_line(cfg, info)):
            self.log(line)  # only where workers start: resident or in-memory data has none to cap
        if idle := self._idle_average_line():
            self.log(idle)
        if cfg.optim.label_smoothing > 0:
            self.log(smoothed_loss_line(cfg.optim.label_smoothing, self.bundle.num_classes))
        if cfg.speed.precision == "fp16" and info.device.type == "cpu":
            # the CPU has no fast fp16 convolutions: the digits' cnn3 ran 30 img/s in fp16 against 575 in fp32
            self.log(
                "warning: --precision fp16 on the CPU runs many times slower than fp32 (no fast fp16 kernels "
                "there): expected fp32, or bf16 where the CPU has it (auto chooses)"
            )
        if self.ddp is not None:  # what DDP itself runs with (its buckets and switches, dist.ddp_*)
            d = self.ddp
            graph = "on" if d.static_graph else "off"
            buffers = "sent from rank 0 every forward" if d.broadcast_buffers else "per rank until each evaluation"
            mib = d.bucket_bytes_cap / 2**20
            self.log(f"ddp: gradient buckets {mib:g} MiB, static graph {graph}, buffers {buffers}")
        augment = resolve_augment(cfg.data.augment, self.bundle.shape, self.bundle.loader_crops, self.bundle.grey)
        said = augment
        if self.bundle.loader_crops:  # photos: every reader draws random-resized crops (decoders, store, textbook)
            crop = f"random-resized crop ({100 * cfg.data.crop_min_scale:g}-100 % of the area, --crop-min-scale)"
            said = crop + ("" if augment == "none" else f" + {augment}")
        self.log(f"{split_line(self.bundle)}; augment {said}")
        if self.bundle.load_note:
            self.log(self.bundle.load_note)
        if self.bundle.skipped_note:
            self.log(self.bundle.skipped_note)
        # the augmentation itself, not the line that says it: its " + flip" after the crop's words is no flip token,
        # and an explicit flip of grey photos went unwarned
        b = self.bundle
        mirrored = mirror_warning(augment, b.shape, b.loader_crops, b.origin, b.grey)
        if mirrored:
            self.log(mirrored)
        views = self.cfg.run.tta_in_effect
        mirrored_views = tta_mirror_warning(views, b.shape, b.loader_crops, b.origin, b.grey)
        if mirrored_views:
            self.log(mirrored_views)
        if self.bundle.val_overlap:
            self.log(self.bundle.val_overlap)
        for line in class_lines(self.bundle):
            self.log(line)
        if self.bundle.size_from:
            size_from = self.bundle.size_from
            if self.resumed_from is not None and size_from == "--image-size":
                # a resume reads the run's size from its config.toml, typed or not (a size other than the
                # checkpoint's is refused above): "--image-size" alone said the user typed one
                size_from = "the resumed run's, from its config.toml"
                if self.size_from_checkpoint:  # an older record's automatic 0 (cliargs._trained_side)
                    size_from = f"the resumed run's, from its checkpoint {self.resumed_from}"
            self.log(f"image size: {self.bundle.shape[1]} ({size_from})")
        if self.bundle.size_note:
            self.log(self.bundle.size_note)
        if self.decode_line:
            self.log(self.decode_line)
        if cfg.speed.stem_space_to_depth == "on":
            blocked = [n for n, m in self.raw_model.named_modules() if isinstance(m, SpaceToDepthConv2d)]
            line = stem_line(blocked, self.requested_cfg.speed.stem_space_to_depth)
            if line:
                self.log(line)
        if self.long_compiles_line:
            self.log(self.long_compiles_line)
        if self.stream.describe():
            self.log(f"training stream: {self.stream.describe()}")
        if info.device.type == "cuda":
            self.log(device_queues_line())
        slots = getattr(self.train_loader.decoder, "slots", None)
        if slots is not None:  # data/byte_slots.py
            self.log(f"encoded batches: {slots.describe()}")
        self.log(f"run folder: {self.run_dir}")
        if self.board.line:
            self.log(self.board.line)
        if restarts_cannot_find_run(cfg):
            self.log(
                "warning: torchrun may restart this job (--max-restarts) but it has no stable name: pass "
                "--name or --rdzv-id, or a restart starts over in a new folder instead of resuming"
            )
        with self._memory_said("the training step", TRAINING_WAYS):  # compile's rehearsal, the graph's capture
            self.warm_up_compile()
        t_start = self._t_start = time.perf_counter()
        self.ended_overflowing: tuple | None = None  # check_diverged's fp16 end, raised once the records are written
        for epoch in range(self.start_epoch, cfg.run.epochs + 1):
            if info.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(info.device)
            with self._memory_said("the training step", TRAINING_WAYS):
                row = {"epoch": epoch, **self.train_epoch(epoch)}
            if epoch % cfg.run.eval_every == 0 or epoch == cfg.run.epochs:
                t_eval = time.perf_counter()
                with self._memory_said("the evaluation", EVALUATION_WAYS):
                    evaluated = self.evaluate()  # ends on a device read, so the time holds the device's work
                if evaluated:  # {} without a validation set: no evaluation, no time for one
                    row.update(evaluated, eval_s=time.perf_counter() - t_eval, eval_wait_s=self.eval_wait_s)
            # before the epoch's checkpoint can replace the last good one
            self.check_diverged(epoch, row, finish_first=True)
            row["lr"] = last_step_lr(self.scheduler)  # the lr the epoch ended at, not the next epoch's first
            row["peak_mem_mb"], row["peak_mem_kind"] = peak_memory(info.device)
            row["skipped_steps"] = self.precision.skipped_steps
            self.history.append(row)
            self._end_epoch(epoch, row)
            raise_pending_stop()  # before the next epoch begins: the one just saved is kept
        summary = self._summary(time.perf_counter() - t_start)
        if info.is_main:
            self._write_summary(summary)
        barrier(info)
        if self.ended_overflowing is not None:  # every epoch kept, the last one's weights finite: now the error
            self._diverged(*self.ended_overflowing)
        return TrainResult(self.run_dir, self.history, summary)

    def _memory_said(self, phase: str, ways: str) -> contextlib.AbstractContextManager:
        """Out of memory in `phase` said in one line (DeviceMemoryFull), not torch's traceback: `fit` only, as tune
        and the bench call `train_epoch` themselves and take torch's error as a measurement's result."""
        return memory_full_said(phase, self.cfg.run.batch_size, self.bundle.shape, self.info.device, ways)

    def _idle_average_line(self) -> str:
        """A note where the weight average makes no update in this run's steps (--ema-every past them, or a late
        --ema-start with no later multiple of it; a preset's in a short run): it never starts, and validation, the
        best checkpoint and predict then use the trained weights (WeightAverage.eval_model); "" otherwise. An
        average a resumed checkpoint started is evaluated all the same."""
        average = self.average
        if average is None or average.started:
            return ""
        total, done = average.total_steps, self.scheduler.last_epoch
        first = average.first_update(done)
        if first <= total:
            return ""
        o = self.cfg.optim
        steps = f"steps {done + 1}-{total} of this run" if done else f"this run's {total} optimizer steps"
        lookahead = ", nor does --lookahead copy it back" if o.lookahead else ""
        return (
            f"note: weight average (--ema {o.ema:g}): no update in {steps} (the first would be step {first}: "
            f"--ema-every {o.ema_every}, --ema-start {o.ema_start:g}){lookahead}: validation, ckpt/best.pt and "
            "predict use the trained weights"
        )

    def _finished_already(self) -> TrainResult:
        """A resume whose checkpoint holds every epoch --epochs asks for: its config.toml, summary, metrics
        and TensorBoard files stay as they are, but for a summary.json or metrics.csv that does not hold the
        checkpoint's epochs (an attempt stopped after its last checkpoint, before writing them, or while
        saving an epoch the checkpoint does not hold): those are written again from the checkpoint."""
        try:
            with closing_feeders(self.train_loader, self.val_loader):
                self.log(self.nothing_to_do)
                summary = self._summary(0.0)
                if self.info.is_main:
                    self._rewrite_stale_records(summary)
                barrier(self.info)
                return TrainResult(self.run_dir, self.history, summary)
        finally:
            self.stream.exit()  # entered in __init__, as fit's own run exits it

    def _rewrite_stale_records(self, summary: dict) -> None:
        path = self.run_dir / "summary.json"
        try:
            written = json.loads(path.read_text(**TEXT))
        except (OSError, ValueError):
            written = None  # missing or half-written: written again
        if not isinstance(written, dict):  # and JSON other than an object (a list, edited by hand)
            written = {"epochs": None}
        summary_epochs, finished = written.get("epochs"), written.get("finished", True)
        stale = []
        if summary_epochs != len(self.history) or not finished:  # stopped after its last epoch's checkpoint
            self._write_summary(summary)
            stale.append("summary.json")
        if self._metrics_stale():
            self._write_metrics()
            stale.append("metrics.csv")
        if stale and summary_epochs is not None:
            self.log(
                f"{' and '.join(stale)} written again from the checkpoint's {len(self.history)} epochs (an attempt "
                "stopped before they matched it)"
            )

    def _metrics_stale(self) -> bool:
        """metrics.csv missing, holding other epochs than the checkpoint (self.history), or unreadable as the
        table it writes (no epoch column: edited by hand, or bytes that are not text where its header was, which ended
        the resume in a KeyError traceback): the checkpoint holds every row, so each is written again from it."""
        metrics = self.run_dir / "metrics.csv"
        held = [str(r["epoch"]) for r in self.history]
        try:
            return [r["epoch"] for r in read_csv(metrics)] != held
        except (OSError, ValueError, KeyError, csv.Error):  # read_csv keeps undecodable bytes (surrogateescape)
            return True

    def _end_epoch(self, epoch: int, row: dict) -> None:
        if self.info.is_main:
            self.board.end_epoch(row, self.board_step())  # on disk before the checkpoint it resumes from
            t_save = time.perf_counter()
            state = self._state(epoch)
            save_checkpoint(self.run_dir / "ckpt" / LAST, state)
            self.saved_epoch = epoch
            if self._best_so_far(row):  # after last.pt: a stop between the two loses the best, never the run
                save_checkpoint(self.run_dir / "ckpt" / BEST, best_state(state))
                self.best_saved_epoch = epoch
            # on the epoch's line and summed in the summary (not a metrics.csv column: see METRIC_COLUMNS)
            row["checkpoint_s"] = time.perf_counter() - t_save
            # said once the checkpoint holds the epoch, before the records: a record that could not be written then
            # ended the run before the user saw that the epoch had finished and was saved
            val = f"  val loss {row['val_loss']:.4f} acc {100 * row['val_acc']:.2f}%" if "val_acc" in row else ""
            between = (
                f"eval {row['eval_s']:.2f} s incl. {row['eval_wait_s']:.2f} s data wait, " if "eval_s" in row else ""
            )
            skipped = f"  skipped {row['skipped_steps']}" if self.precision.scaler is not None else ""
            self.log(
                f"epoch {epoch}/{self.cfg.run.epochs}  train loss {row['train_loss']:.4f} "
                f"acc {100 * row['train_acc']:.2f}%{val}  {rate_text(row['images_per_s'])} img/s  "
                f"data wait {100 * row['data_wait_share']:.0f}%  {row['epoch_s']:.1f} s{skipped}  "
                f"({between}checkpoint {row['checkpoint_s']:.2f} s)"
            )
            # after the checkpoint, as the summary: written before it, a stop in its write (or a full disk) left a
            # row for an epoch that no checkpoint holds
            self._write_metrics()
            if epoch < self.cfg.run.epochs:  # the last epoch's is written whole, finished, once the loop ends
                # the epochs the checkpoint holds, whatever ends the run next: a SIGTERM that torchrun's workers
                # die of unheard, or a SIGKILL, left no summary, or an earlier attempt's of fewer epochs (after
                # checkpoint_s is taken: the summary's own write is not the checkpoint's time)
                wall = time.perf_counter() - self._t_start if self._t_start is not None else 0.0
                self._write_summary(self._summary(wall, finished=False))
        barrier(self.info)  # no rank races ahead of the checkpoint it may have to resume from

    def _best_so_far(self, row: dict) -> bool:
        """Whether this epoch's validation accuracy beats every earlier epoch's (ties keep the earlier: its
        weights are on disk already)."""
        if "val_acc" not in row:
            return False
        earlier = [r["val_acc"] for r in self.history if "val_acc" in r and r["epoch"] < row["epoch"]]
        return not earlier or row["val_acc"] > max(earlier)

    def _keep_best_of(self, state: dict, path: Path) -> None:
        """On resuming from `state` (read from `path`): ckpt/best.pt from an epoch the checkpoint does not hold (an
        attempt stopped between the two writes) is not this run's any more, and goes; otherwise the epoch it holds
        is the summary's. Where the checkpoint's own epoch is the best and best.pt misses it (a kill between
        last.pt's write and best.pt's), best.pt is written from the checkpoint: it stayed an earlier epoch's for
        good, since no later epoch beat the best, while the summary named the best epoch's accuracy."""
        if not self.info.is_main:
            return
        finished = int(state["epoch"])
        best = self.run_dir / "ckpt" / BEST
        held = checkpoint_epoch(self.run_dir, best) if best.is_file() else 0
        if best.is_file() and (held > finished or not held):
            best.unlink()
            why = f"it held epoch {held}, past the {finished} epochs the checkpoint keeps" if held else "unreadable"
            self.log(f"removed {best}: {why}; the next best epoch writes it again")
            held = 0
        row = next((r for r in self.history if r["epoch"] == finished), None)
        if held < finished and row is not None and self._best_so_far(row):
            save_checkpoint(best, best_state(state))
            self.log(f"{best}: written from {path}, whose epoch {finished} is the best (an attempt stopped before it)")
            held = finished
        self.best_saved_epoch = held

    def _summary(self, wall_s: float, finished: bool = True) -> dict:
        rows = self.history
        vals = [r for r in rows if "val_acc" in r]
        best = max(vals, key=lambda r: r["val_acc"]) if vals else None
        # The epochs' own rates leave out what happens between them: the evaluation, the checkpoint, and
        # the next epoch's pipeline started meanwhile (DeviceFeeder.prepare), whose head start a short
        # epoch's rate then includes. The whole loop's rate is the figure that holds all of it.
        ran = [r for r in rows if r["epoch"] >= self.start_epoch]  # this process's epochs (wall_s is theirs)
        trained = sum(r["images"] for r in ran)
        # this process's epochs without its first (a warm-up: compile, cuDNN timing, workers starting), where it
        # ran more than one: an earlier attempt's epochs may have run on another machine or world size
        # (a resume with nothing left to train ran none: then the whole run's, after its first)
        steady = (ran[1:] or ran) if ran else (rows[1:] or rows)
        return {
            "model": self.cfg.model.name,
            "data": self.bundle.origin,
            "epochs": len(rows),
            # false: these are the epochs the checkpoint holds, short of --epochs (running, or stopped or killed:
            # --resume continues it); true once the run trained its last epoch
            "finished": finished,
            "best_val_acc": best["val_acc"] if best else None,
            "val_overlap": self.bundle.val_overlap,  # non-empty: validation files are training files
            "best_epoch": best["epoch"] if best else None,
            # the epoch ckpt/best.pt holds: best_epoch's but where a stop fell between that epoch's two checkpoint
            # writes, or the run began before cnnpar kept the best (None: no best.pt)
            "best_ckpt_epoch": self.best_saved_epoch or None,
            "final_val_acc": vals[-1]["val_acc"] if vals else None,
            # from here to compile_s: this process's epochs (a resumed run's last attempt), not the whole run
            "images_per_s": sum(r["images_per_s"] for r in steady) / len(steady) if steady else None,
            "images_per_s_epochs": [steady[0]["epoch"], steady[-1]["epoch"]] if steady else None,
            "attempt_epochs": [ran[0]["epoch"], ran[-1]["epoch"]] if ran else None,
            "train_s": wall_s,
            "images_trained": trained,
            "images_per_s_with_eval": trained / wall_s if wall_s > 0 and ran else None,
            # where the whole loop's time beyond the epochs went (an epoch without an evaluation has no eval_s;
            # only rank 0 writes checkpoints, so only its rows have checkpoint_s)
            "eval_s": sum(r.get("eval_s", 0.0) for r in ran),
            "eval_wait_s": sum(r.get("eval_wait_s", 0.0) for r in ran),
            "checkpoint_s": sum(r.get("checkpoint_s", 0.0) for r in ran),
            "epochs_s": sum(r["epoch_s"] for r in ran),
            "compile_s": self.compile_s,
            "peak_mem_mb": max((r["peak_mem_mb"] for r in rows), default=None),
            "peak_mem_kind": rows[-1].get("peak_mem_kind") if rows else None,  # rows from an older checkpoint lack it
            "skipped_steps": self.precision.skipped_steps,
            # false: --ema asked for an average that made no update (its first step lay past the run's), so the
            # accuracies and checkpoints are the trained weights'; null without --ema
            "average_started": self.average.started if self.average is not None else None,
            "global_batch": self.cfg.run.batch_size * self.info.world_size * self.cfg.optim.grad_accum,
            "precision": self.cfg.speed.precision,
            "channels_last": self.cfg.speed.channels_last,
            "compile": self.cfg.speed.compile,
            "run_dir": str(self.run_dir),
            **self._environment(),
        }

    def _environment(self) -> dict:
        """The run record's environment: the machine and versions, and the strategy (with Horovod's version)."""
        from cnnpar.parallel.horovod import strategy_record

        return {**environment(self.info.device, self.info.world_size), **strategy_record(self.cfg.dist.strategy)}
