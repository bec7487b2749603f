"""Loaders: sampling, worker processes, host-to-device copies and device-side transforms.

Every path hands the train step `(x, y)` already on the device, normalised and augmented.
Sharding is always a `DistributedSampler` (world size 1 included), so single-process and
distributed runs draw from the same code; `set_epoch` must be called every epoch or every epoch
repeats the first permutation.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import queue
import random
import sys
import threading
import warnings
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler, Subset, get_worker_info

from cnnpar.config import RESIDENT_MEMORY_SHARE, Config, resolve_decode
from cnnpar.data import byte_slots
from cnnpar.data.bundle import ArrayDataset, DataBundle
from cnnpar.data.byte_slots import ByteSlots, SlottedBatches
from cnnpar.data.cpu_decode import CpuDecodedFolder, cpu_jpeg_line, damage_flags_of
from cnnpar.data.folder import ImageFolderDataset
from cnnpar.data.gpu_decode import GpuDecoder, SlottedEncodedFolder
from cnnpar.data.hybrid_decode import HybridFolder
from cnnpar.data.nvjpeg_hw import jpeg_engines
from cnnpar.data.private_stream import private_stream
from cnnpar.data.store import prepare_then_train
from cnnpar.data.store_feed import StoreCropper, StoreDataset, store_resident
from cnnpar.data.transforms import DeviceTransform, TextbookDataset, mix_seed, resolve_augment
from cnnpar.data.worker_gpu_decode import WorkerGpuDecodedFolder
from cnnpar.data.workers import end_workers_at_exit, kill_stuck, refuse_unwritable_shm, report_unsent_batches
from cnnpar.dist import DistInfo
from cnnpar.errors import STOP_SIGNALS, ConfigError, stops_held
from cnnpar.host_facts import usable_cores
from cnnpar.report.host import WORKERS_PER_CORE, worker_cap_line
from cnnpar.report.ranges import H2D_COPY, span
from cnnpar.socket_folder import init_socket_folder
from cnnpar.worker_start import worker_context


class ShardSampler(Sampler[int]):
    """rank, rank + world, ...: every sample exactly once over all ranks, no padding.

    For evaluation: DistributedSampler pads the last shard with repeats, which would count some
    samples twice and make distributed accuracy differ from a single-process evaluation.
    """

    def __init__(self, n: int, rank: int, world_size: int) -> None:
        self.n, self.rank, self.world_size = n, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.n, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.n, self.world_size))


def _array_backed(ds: Dataset) -> bool:
    base = ds.base if isinstance(ds, WithIndex) else ds
    return isinstance(base, ArrayDataset) or getattr(base, "in_memory", False)  # a resident store's index


def auto_workers(dataset: Dataset, info: DistInfo) -> int:
    """In-memory arrays are indexed a batch at a time in the main process (workers would only add
    IPC); decoded sources get a share of the machine's cores per local process."""
    if _array_backed(dataset):
        return 0
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    cores = usable_cores()
    return max(1, min(16, cores // max(1, local_procs) - 1))


def worker_limit(info: DistInfo) -> int:
    """The most worker processes a loader of this process starts: WORKERS_PER_CORE per usable core, shared among
    the local processes as auto_workers shares them."""
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    return max(1, WORKERS_PER_CORE * usable_cores() // max(1, local_procs))


def loader_workers(cfg: Config, ds: Dataset, info: DistInfo) -> int:
    """The worker processes a loader starts: --workers, capped to worker_limit, or auto_workers for -1."""
    if cfg.data.workers < 0:
        return auto_workers(ds, info)
    return min(cfg.data.workers, worker_limit(info))


def workers_cap_line(cfg: Config, info: DistInfo) -> str:
    """The run's line for a --workers that loader_workers caps ("" otherwise). The config keeps the count asked for:
    the cap is this machine's, and a resume on a larger one gets what was asked."""
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    share = f" shared by {local_procs} local processes" if local_procs > 1 else ""
    return worker_cap_line(cfg.data.workers, worker_limit(info), usable_cores(), share)


def wants_resident(cfg: Config, bundle: DataBundle, device: torch.device) -> bool:
    mode = cfg.data.resident
    if mode == "on":  # asked for by name: refused where it cannot hold, rather than recorded "on" and not done
        if cfg.data.loader == "textbook":
            raise ConfigError(
                "--resident on: the textbook loader (--loader textbook) reads sample by sample on the host by "
                "design: expected --resident auto or off with it"
            )
        base = bundle.train.dataset if isinstance(bundle.train, Subset) else bundle.train
        if not bundle.in_memory and not isinstance(base, StoreDataset):  # a store goes by store_resident
            raise ConfigError(
                f"--resident on: {bundle.origin} is decoded batch by batch, never held whole: expected in-memory "
                "data (a CSV, an .npz, digits, synthetic) or a prepared .cnnpar store (cnnpar prepare)"
            )
    if mode == "off" or not bundle.in_memory or cfg.data.loader == "textbook":
        return False
    if mode == "on":
        return True
    if device.type != "cuda":
        return False
    need = bundle.train.x.nbytes + (bundle.val.x.nbytes if bundle.val is not None else 0)
    free, _ = torch.cuda.mem_get_info(device)
    return need < RESIDENT_MEMORY_SHARE * free


class WithIndex(Dataset):
    """A data set whose items (or whole batches, for a list of indices) carry their sample indices,
    for transforms that depend on which sample they see (the alternating flip)."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return x, y, torch.as_tensor(i, dtype=torch.int64)


def epoch_indices(sampler: Sampler) -> torch.Tensor:
    """This epoch's indices from `sampler`, as one int64 tensor.

    A DistributedSampler's and a ShardSampler's are computed with tensor ops, by the sampler's own
    rule (a permutation seeded with seed + epoch, padded by repetition to a multiple of the world
    size or cut to one, then every world-size-th from the rank's): listing CIFAR-10's 50,000 as
    Python ints took 15 ms per epoch on this project's CPU, time the GPU of a resident run waits.
    tests/unit/test_muon_record.py checks both against the samplers' own lists."""
    if type(sampler) is ShardSampler:
        return torch.arange(sampler.n, dtype=torch.int64)[sampler.rank :: sampler.world_size]
    if type(sampler) is not DistributedSampler:
        return torch.as_tensor(list(sampler), dtype=torch.int64)
    n = len(sampler.dataset)
    if sampler.shuffle:
        idx = torch.randperm(n, generator=torch.Generator().manual_seed(sampler.seed + sampler.epoch))
    else:
        idx = torch.arange(n, dtype=torch.int64)
    if sampler.drop_last:
        idx = idx[: sampler.total_size]
    elif sampler.total_size > n:
        idx = torch.cat([idx, idx.repeat(-(-(sampler.total_size - n) // n))[: sampler.total_size - n]])
    return idx[sampler.rank : sampler.total_size : sampler.num_replicas]


class ResidentLoader:
    """The whole uint8 data set on the device; a batch is one index_select, no workers, no copies.

    Indices come from the same DistributedSampler a host loader would use, so each rank draws
    its own shard and every epoch is a new permutation. With `with_index` each batch also carries
    its sample indices (already on the device).
    """

    def __init__(
        self,
        ds: ArrayDataset,
        sampler: Sampler,
        batch_size: int,
        drop_last: bool,
        device: torch.device,
        with_index: bool = False,
    ) -> None:
        self.x = ds.x.to(device)
        self.y = ds.y.to(device)
        self.sampler, self.batch_size, self.drop_last, self.device = sampler, batch_size, drop_last, device
        self.with_index = with_index
        self._ahead: tuple[int, threading.Thread, list] | None = None  # (epoch, thread, [its indices])

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _epoch_indices(self) -> torch.Tensor:
        """This epoch's indices, drawn in a thread while the epoch before trained where it was the
        next one. A shuffled epoch's permutation of CIFAR-10's 50,000 took 6-15 ms on this project's
        CPU: at the start of an epoch, after the sync that ended the last one, the GPU waits for it."""
        epoch = getattr(self.sampler, "epoch", None)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] == epoch:
            ahead[1].join()
        if ahead is not None and ahead[0] == epoch and ahead[2]:
            idx = ahead[2][0]
        else:  # the first epoch, another one than the next (a resumed run, an epoch iterated twice), a failed draw
            idx = epoch_indices(self.sampler)
        if type(self.sampler) is DistributedSampler and self.sampler.shuffle:
            self._ahead = self._draw_ahead(epoch + 1)
        return idx

    def _draw_ahead(self, epoch: int) -> tuple[int, threading.Thread, list]:
        sampler = copy.copy(self.sampler)  # the loop sets the epoch of its own meanwhile
        sampler.set_epoch(epoch)
        out: list = []

        def draw() -> None:  # randperm releases the GIL: the training thread keeps launching
            # not pinned: the copy to the device comes after the sync that ends an epoch, with the
            # device idle anyway, and no CUDA call here can meet a graph capture in the other thread
            out.append(epoch_indices(sampler))

        thread = threading.Thread(target=draw, name="cnnpar-epoch-indices", daemon=True)
        thread.start()
        return epoch, thread, out

    def __iter__(self):
        idx = self._epoch_indices().to(self.device, non_blocking=True)
        for b in range(len(self)):
            sel = idx[b * self.batch_size : (b + 1) * self.batch_size]
            batch = self.x.index_select(0, sel), self.y.index_select(0, sel)
            yield (*batch, sel) if self.with_index else batch


class DeviceFeeder:
    """Iterate a host (or resident) loader and yield device-ready batches.

    Three ways, by what a batch needs before the step can use it:
    - a copy (and transform): with a side stream, the copy and transform of batch i+1 are queued
      on their own CUDA stream while batch i computes; `wait_stream` orders the use,
      `record_stream` keeps the caching allocator from reusing the memory while the main stream
      still reads it;
    - a decoder (JPEG bytes, or a store's raw pixels, cropped and resized on the device), with
      `threaded`: a thread of its own prepares up to QUEUE_DEPTH batches ahead on its own stream.
      A GPU decode makes the calling thread wait for the decoder (torchvision synchronises its
      decode stream) and crop boxes cost host work; in the training thread both would stall the
      launch of the next step, in their own thread they overlap it. A JPEG decoder runs in two
      threads (`pipelined`): one decodes batch i+1 while the other crops and resizes batch i, so
      the decoder's host waits overlap the resize's launches. The training thread waits for a
      batch's event on the device, never on the host;
    - neither (the CPU): in line.
    """

    QUEUE_DEPTH = 3
    PREPARE = True  # `prepare` starts the next epoch's pipeline early; benchmarks/jpeg_pipeline.py's prepare=0 compares
    STREAM_PRIORITY = 0  # of the feeder threads' streams; benchmarks/jpeg_pipeline.py's prio= compares -1 (high)
    PIPELINE: bool | None = None  # None: the decoder's own rule (GpuDecoder.two_stage); benchmarks force it

    def __init__(
        self,
        loader,
        sampler,
        transform: DeviceTransform,
        device: torch.device,
        train: bool,
        side_stream: bool,
        decoder: GpuDecoder | StoreCropper | None = None,
        threaded: bool | None = None,
    ) -> None:
        self.loader, self.sampler, self.transform, self.decoder = loader, sampler, transform, decoder
        self.device, self.train = device, train
        self.stream = torch.cuda.Stream(device) if side_stream and device.type == "cuda" else None
        self.threaded = threaded if threaded is not None else (decoder is not None and device.type == "cuda")
        # a JPEG decoder's two stages in two threads (the store's cropper has one stage)
        two_stage = getattr(decoder, "two_stage", False) if self.PIPELINE is None else self.PIPELINE
        self.pipelined = self.threaded and hasattr(decoder, "decode_stage") and two_stage
        self._pending = None  # an epoch's pipeline started ahead by `prepare`, and for which (epoch, seed)
        self._pending_for: tuple[int, int | None] | None = None
        self._stage_streams: dict[str, torch.cuda.Stream] = {}  # `_stage_stream`

    def _stage_stream(self, stage: str) -> torch.cuda.Stream | None:
        """The stream of a pipeline stage's thread (None off CUDA), made on first use and kept: streams
        drawn anew every epoch from torch's pool come round again after some epochs (32 per device), and
        one of them is then the training thread's own, whose step the stage's work would queue behind
        (data/private_stream.py)."""
        if self.device.type != "cuda":
            return None
        if stage not in self._stage_streams:
            made = private_stream(self.device, self.STREAM_PRIORITY)
            self._stage_streams[stage] = made or torch.cuda.Stream(self.device, priority=self.STREAM_PRIORITY)
        return self._stage_streams[stage]

    def set_epoch(self, epoch: int, seed: int | None = None) -> None:
        """`seed`: reseed the transform's and the decoder's generators, so what this epoch draws
        depends on (seed, rank, epoch) alone (engine/rng.py), not on the epochs before it. For the
        epoch `prepare` already started with this seed, nothing changes: its generators are in use."""
        if self._pending is not None:
            if self._pending_for == (epoch, seed):
                return
            self._discard_pending()  # started for another epoch: its batches are not this one's
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        self.transform.set_epoch(epoch)  # the alternating flip's parity
        if seed is not None:
            self.transform.generator.manual_seed(seed)
            if isinstance(getattr(self.decoder, "generator", None), torch.Generator):
                self.decoder.generator.manual_seed(seed)
            if isinstance(getattr(self.loader, "sampler", None), EpochSeeded):  # to the worker processes
                self.loader.sampler.seed = seed

    def __len__(self) -> int:
        return len(self.loader)

    def prepare(self, epoch: int, seed: int | None = None) -> None:
        """Set the next epoch (as `set_epoch`) and, for a threaded pipeline, start it now: its first
        batches are read, decoded and resized while the run evaluates and saves, so that the epoch's
        first step does not wait for the pipeline to fill (a GPU decoder's first batch waits for a
        worker's read, the decode and the resize; on an H200, epochs of ~23 batches of photos ran ~8 %
        slower than epochs of ~90: docs/decoding.md). The batches are the ones a pipeline started at
        the epoch itself would make: the same seeds, set before the threads start. While it waits, the
        pipeline holds its queues' batches on the device (a few decoded and a few resized batches) beside
        the evaluation's own."""
        self.set_epoch(epoch, seed)
        if self.threaded and self.PREPARE and self._pending is None:
            self._pending, self._pending_for = self._start_threaded(), (epoch, seed)

    def _discard_pending(self) -> None:
        pending, self._pending, self._pending_for = self._pending, None, None
        if pending is not None:
            pending.close()  # stops its threads, which stop pulling from the loader

    def close(self) -> None:
        """The run is over: stop the host loader's worker processes and release what the decoder holds
        outside Python (the JPEG engines' handle)."""
        self._discard_pending()
        shutdown_workers(self.loader)
        if hasattr(self.decoder, "close"):
            self.decoder.close()

    def _ready(self, x, y: torch.Tensor, index: torch.Tensor | None = None):
        with span(H2D_COPY):
            if self.decoder is not None:  # a batch of encoded or raw images: its indices travel with it
                index = x.index
                x = self.decoder(x)
            else:
                x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
        return self.transform(x, self.train, index), y

    def __iter__(self):
        if self.threaded:
            return self._iter_threaded()
        if self.stream is None:
            # the pass is made here, by iter(feeder), not at the first batch: DataLoader workers start (or persistent
            # ones are given the epoch) before the step loop times its first `next` as data wait
            return self._one_pass(iter(self.loader), self._ready)
        return self._iter_side_stream()

    def _one_pass(self, batches, prepare=None):
        """The loader's batches for one pass (`batches`: `iter(self.loader)`, made by the caller's thread, where
        DataLoader workers must start), each given to `prepare` where one is given. A pass that ends early (a worker's
        error raised here, an error of `prepare`, a stop, a loop left and its iterator closed) takes the pass's own
        worker processes down at once: torch leaves them to the collection of its iterator, which the error's
        traceback or a reference cycle can put off, and its clean-up then joined each worker with a timeout inside
        whatever ran next (an in-process `predict --workers 2` on a damaged photo: ~20 s in the next call; the workers
        lived on in a notebook till then). The inline path's `_ready` runs here, inside this `finally`'s reach: run
        after the batch left this generator (`--decode gpu` off CUDA decodes in the main process), its error's
        traceback held this generator, and the workers with it, for as long as the caller kept the error. Persistent
        workers serve the next pass; `close` ends them."""
        try:
            if prepare is None:
                yield from batches
            else:
                for batch in batches:
                    yield prepare(*batch)
        finally:
            if batches is not getattr(self.loader, "_iterator", None):
                stop_iterator_workers(batches)

    def _iter_side_stream(self):
        main = torch.cuda.current_stream(self.device)
        nxt = None
        for raw in self._one_pass(iter(self.loader)):
            with torch.cuda.stream(self.stream):
                self.stream.wait_stream(main)  # the resident data set's index tensors were made on main
                batch = self._ready(*raw)
            if nxt is not None:
                yield nxt
            main.wait_stream(self.stream)
            for t in batch:
                t.record_stream(main)
            nxt = batch
        if nxt is not None:
            yield nxt

    def _decode_only(self, raw):
        """The first of two stages: decode (the host waits for the decoder here)."""
        x, y = raw
        with span(H2D_COPY):
            return x.index, self.decoder.decode_stage(x), y

    def _resize_and_transform(self, decoded):
        """The second stage: crop, resize and transform on this thread's stream."""
        index, d, y = decoded
        with span(H2D_COPY):
            x = self.decoder.resize_stage(d)
            y = y.to(self.device, non_blocking=True)
        return self.transform(x, self.train, index), y

    def _start_threaded(self) -> _Pipe:
        """The epoch's pipeline, its threads started: batches come out of the returned `_Pipe`."""
        source = self._one_pass(iter(self.loader))  # made here: DataLoader workers start from the calling thread
        if self.pipelined:
            # batch i+1 decodes in one thread while batch i is cropped and resized in another
            decoded = _in_thread(
                source, self._decode_only, self.device, 2, "cnnpar-decode", self._stage_stream("decode"), handoff=True
            )
            batches = _in_thread(
                decoded,
                self._resize_and_transform,
                self.device,
                self.QUEUE_DEPTH,
                "cnnpar-feeder",
                self._stage_stream("feed"),
            )
        else:
            batches = _in_thread(
                source,
                lambda raw: self._ready(*raw),
                self.device,
                self.QUEUE_DEPTH,
                "cnnpar-feeder",
                self._stage_stream("feed"),
            )
        return batches

    def _iter_threaded(self):
        # the prepared pipeline is taken only once iteration starts: an iterator closed before its first
        # batch (a generator's `finally` does not run then) leaves it to the feeder, whose close stops it
        batches, self._pending, self._pending_for = self._pending, None, None
        batches = batches if batches is not None else self._start_threaded()
        try:
            for batch in batches:
                if self.device.type == "cuda":
                    main = torch.cuda.current_stream(self.device)
                    for t in batch:
                        t.record_stream(main)
                yield batch
        finally:
            batches.close()


class _Pipe:
    """A stage's results, in order; `close` stops its thread even before the first result is taken
    (a generator's `finally` would not run then: an epoch `prepare`d and then not trained)."""

    def __init__(self, results, shutdown) -> None:
        self._results, self._shutdown = results, shutdown

    def __iter__(self) -> _Pipe:
        return self

    def __next__(self):
        return next(self._results)

    def close(self) -> None:
        self._results.close()
        self._shutdown()


class _Ready:
    """A stage's output and the event after its device work (None on the CPU)."""

    __slots__ = ("value", "event")

    def __init__(self, value, event) -> None:
        self.value, self.event = value, event


def _in_thread(
    source, fn, device: torch.device, depth: int, name: str, stream: torch.cuda.Stream | None, handoff: bool = False
) -> _Pipe:
    """`fn(item)` for each item of `source`, computed in a thread of its own, up to `depth` ahead,
    in order. On CUDA the thread works on `stream`, its stage's own, and whoever uses a result first
    makes its stream wait (on the device, not the host) for the work behind it: the consumer's
    current stream, or, with `handoff`, the next stage's thread (results then travel as `_Ready`).
    An exception in the thread reaches the consumer; a consumer that stops (end, error, abandoned
    generator) stops the thread, which closes `source`, so a stage before it stops in turn."""
    cuda = device.type == "cuda"
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                for item in source:
                    if isinstance(item, _Ready):  # from the stage before: its work first, on the device
                        if item.event is not None:
                            stream.wait_event(item.event)
                        item = item.value
                    value = fn(item)
                    event = None
                    if cuda:
                        event = torch.cuda.Event()
                        event.record(stream)
                    while not stop.is_set():
                        try:
                            out.put(_Ready(value, event), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
            out.put(None)
        except BaseException as e:  # handed to the consumer, which raises it
            out.put(e)
        finally:
            if hasattr(source, "close"):
                source.close()

    worker = threading.Thread(target=produce, name=name, daemon=True)
    worker.start()

    def shutdown() -> None:
        stop.set()
        while worker.is_alive():
            try:
                out.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()

    def consume():
        try:
            while True:
                item = out.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                if handoff:
                    yield item
                    continue
                if item.event is not None:
                    torch.cuda.current_stream(device).wait_event(item.event)
                yield item.value
        finally:
            shutdown()

    return _Pipe(consume(), shutdown)


def draws_in_workers(ds: Dataset) -> bool:
    """Whether worker processes draw random numbers for this data set (training augmentation)."""
    ds = ds.cpu if isinstance(ds, HybridFolder) else ds
    return isinstance(ds, (TextbookDataset, CpuDecodedFolder, WorkerGpuDecodedFolder)) and ds.train


class EpochSeeded(Sampler):
    """Yields `(item, seed)`: the epoch's seed travels to the workers with every index.

    Persistent workers are seeded once, when they start, and would carry their draws from epoch
    to epoch in processes that no checkpoint reaches; `ReseedingWorkers` reseeds each worker at
    the first item of a new seed, so an epoch's crops and flips depend on (seed, rank, epoch)
    alone (engine/rng.py) and the workers still stay alive between epochs. Until a seed is set
    (`DeviceFeeder.set_epoch(epoch, seed)`; the compile warm-up's batch comes before it) the
    workers keep the DataLoader's own seeds, and the first epoch's seed is then always new."""

    def __init__(self, base) -> None:
        self.base, self.seed = base, None

    def __iter__(self):
        seed = self.seed
        return ((item, seed) for item in self.base)

    def __len__(self) -> int:
        return len(self.base)


class ReseedingWorkers(Dataset):
    """`ds[(item, seed)]` is `ds[item]`, after reseeding this worker's generators when `seed` is new."""

    WORKER_SPACING = 1024  # worker w of a process draws from seed * 1024 + w: none meet below 1024 workers

    def __init__(self, base: Dataset) -> None:
        self.base, self.seed = base, None

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, item_seed):
        item, seed = item_seed
        if seed is not None and seed != self.seed:
            info = get_worker_info()
            worker_seed = (seed * self.WORKER_SPACING + (info.id if info is not None else 0)) % 2**63
            torch.manual_seed(worker_seed)  # CpuDecodedFolder follows torch.initial_seed()
            random.seed(worker_seed)
            np.random.seed(worker_seed % 2**32)
            if hasattr(self.base, "epoch_seed"):  # draws from the epoch's seed itself, the same in every worker
                self.base.epoch_seed = seed
            self.seed = seed
        return self.base[item]


def shutdown_workers(loader) -> None:
    """Stop a DataLoader's persistent worker processes now, not at the interpreter's exit.

    Why: with persistent workers and pinned memory, torch registers an exit hook per worker that joins
    it with a 5 s timeout before killing it; a loader still alive then (a run object kept by a reference
    cycle until the collector's last pass) costs 5 s a worker. On an H200, `cnnpar train` with 14
    workers a loader took over 150 s to leave after its last line, its main thread in that hook
    (benchmarks/results/2026-12-01-h200/call-v/). Shut down here, the workers are told to stop and
    leave at once, and the hook finds them gone. Lightning stops its loaders' workers the same way
    (`_shutdown_workers` on the loader's cached iterator); torch has no public call for it.

    Call it when nothing iterates the loader any more: a thread still waiting in `next()` on it would
    wait for ever (torch marks the workers stopped and no longer checks on them). Every epoch's
    iteration ends (and its feeder threads are joined) before a run closes its feeders."""
    stop_iterator_workers(getattr(loader, "_iterator", None))
    if hasattr(loader, "_iterator"):
        loader._iterator = None


def stop_iterator_workers(iterator) -> None:
    """Stop the worker processes of one DataLoader iterator (none for a single-process one); a second call, or one
    after torch stopped them at the pass's end, does nothing."""
    if hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        # torch ends a worker that did not leave by SIGTERM, which ours ignore (leave_stops_to_the_main_process)
        kill_stuck(getattr(iterator, "_workers", []), grace_s=1.0)


def encoded_slots(ds, batch_size: int, workers: int, prefetch: int, cfg: Config) -> ByteSlots | None:
    """Slots for a GPU decoder's encoded batches (data/byte_slots.py), as many as the loader keeps in flight
    (`prefetch`: loader_prefetch's factor, not --prefetch-factor's, whose 10**9 took the whole slot budget of
    /dev/shm), or None where batches keep their own shared segments: no workers (nothing crosses processes),
    workers started anew each pass (an old pass's workers could still write into a slot the new pass handed out),
    nvImageCodec (whether it is done with its inputs when its call returns is not stated), or no room for a slot."""
    if not byte_slots.ENABLED or workers == 0 or not cfg.data.persistent_workers or cfg.data.decode == "nvimgcodec":
        return None
    count, slot_bytes, _ = byte_slots.plan_slots(ds.files, batch_size, workers * prefetch + 2)
    if count == 0:
        return None
    try:
        return ByteSlots(count, slot_bytes)
    except RuntimeError:  # /dev/shm filled up meanwhile (another process's loader): batches keep their segments
        return None


def loader_prefetch(asked: int, batches: int, workers: int) -> int:
    """--prefetch-factor, within the batches an epoch has: no more can be in flight, and torch primes its queue with
    prefetch x workers tries, one Python call each (--prefetch-factor 10**9 spun there for minutes, a stop held)."""
    return max(1, min(asked, -(-batches // max(1, workers))))


def init_loader_worker(worker_id: int, prefetch: int = 2) -> None:
    """Every DataLoader worker's `worker_init_fn` (`prefetch`: the loader's prefetch_factor, for the line that says
    how much /dev/shm its batches need)."""
    leave_stops_to_the_main_process()
    report_unsent_batches(prefetch)  # a batch /dev/shm has no room for: an error, not a wait for ever
    # a spawned worker (CUDA decoding) makes its socket folder itself, under the TMPDIR it inherits; a forked one
    # has its parent's (cli.main made it short)
    init_socket_folder()


def leave_stops_to_the_main_process() -> None:
    """The stop signals (errors.STOP_SIGNALS: SIGTERM, SIGINT, SIGHUP) ignored in a DataLoader worker. `timeout`, a
    scheduler, a Ctrl-C and a closing terminal signal the whole process group; torch's worker handler then killed a
    worker by SIGTERM's default action (it exits quietly only for its parent's), and SIGHUP's killed it too: its
    `pymp-*` folder left in /tmp, and the main process got "DataLoader worker ... is killed by signal: Terminated" in
    place of its stop or over it: a bench rung recorded as failed, the doctor ended in a traceback. The main process
    stops its workers itself, as on any end (its clean-up, which the stop runs); killed outright, its workers leave
    within torch's 5 s watchdog (they check their parent between batches). Workers that outlive their shutdown or
    the main process's exit are killed (data/workers.py): SIGTERM cannot."""
    import signal

    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextlib.contextmanager
def fork_warning_silenced(forks: bool):
    """Python 3.12+ warns, a DeprecationWarning, at each fork of a process with threads, shown wherever the user's
    filter shows them (-W default, PYTHONWARNINGS, pytest): `This process (pid=...) is multi-threaded, use of fork()
    may lead to deadlocks in the child.` Once a step has run, torch's own intra-op pool is such a thread (the tqdm
    bar's monitor another), so a photo run's first forked DataLoader start said it. Forking is torch's default on
    Linux and the start leave_stops_to_the_main_process relies on; torch runs each worker on one thread, so the
    child never uses the pool it inherits. Only that message is hidden, around the workers' start alone.
    `forks`: whether this start forks workers at all. catch_warnings resets the memory of every warning already shown
    once at its place (the filters' version moves), so a warning the step gives shows again after each start: done
    only where a fork can warn (workers, Python 3.12+), not at every epoch's start of every loader."""
    if not forks or sys.version_info < (3, 12):
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"This process \(pid=\d+\) is multi-threaded", category=DeprecationWarning
        )
        yield


class _WholeIterators(DataLoader):
    """A DataLoader whose iterator is made whole before a stop (SIGTERM, Ctrl-C, SIGHUP) is raised: one raised between
    two worker starts left torch unable to tell the started workers to leave (errors.stops_held)."""

    def _get_iterator(self):
        if self.num_workers > 0:
            # before torch's iterator: one that fails half-made prints an "Exception ignored" traceback as it goes
            refuse_unwritable_shm(self.multiprocessing_context)
        with stops_held(), fork_warning_silenced(self.num_workers > 0):
            return super()._get_iterator()

    def check_worker_number_rationality(self) -> None:
        """Torch warns (three lines, at the loader's start and at each pass's) wherever workers outnumber the usable
        cores; --workers is capped by this package's own rule (worker_limit: WORKERS_PER_CORE a core, said in one
        line), so a --workers 2 on one core (taskset, a container's cpuset) only printed torch's contrary advice."""


def _host_loader(
    ds: Dataset,
    sampler: Sampler,
    batch_size: int,
    drop_last: bool,
    cfg: Config,
    info: DistInfo,
    textbook: bool,
):
    workers = loader_workers(cfg, ds, info)
    prefetch = loader_prefetch(cfg.data.prefetch_factor, len(BatchSampler(sampler, batch_size, drop_last)), workers)
    common = dict(num_workers=workers, pin_memory=cfg.data.pin_memory == "on")
    if workers > 0:
        common["worker_init_fn"] = functools.partial(init_loader_worker, prefetch=prefetch)
        end_workers_at_exit()
        # the data set's own start method (workers that use CUDA themselves), else the default; a spawned or
        # forkserver worker ignores the stop signals from its start (worker_start.py)
        common["multiprocessing_context"] = worker_context(getattr(ds, "start_method", None))
        common.update(persistent_workers=cfg.data.persistent_workers, prefetch_factor=prefetch)
    reseed = workers > 0 and draws_in_workers(ds)
    if (_array_backed(ds) or getattr(ds, "answers_batches", False)) and not textbook:
        # batch_size=None: the sampler yields whole index lists and the data set answers each
        # with one vectorised index_select (or one decoded batch); no per-sample collate.
        batches = BatchSampler(sampler, batch_size, drop_last)
        if isinstance(ds, SlottedEncodedFolder):
            ds.slots = encoded_slots(ds, batch_size, workers, prefetch, cfg)
            if ds.slots is not None:
                batches = SlottedBatches(batches, ds.slots)
        if reseed:
            ds, batches = ReseedingWorkers(ds), EpochSeeded(batches)
        return _WholeIterators(ds, batch_size=None, sampler=batches, **common)
    if reseed:
        ds, sampler = ReseedingWorkers(ds), EpochSeeded(sampler)
    # The sampler owns shuffling: passing shuffle=True beside a sampler raises in DataLoader.
    return _WholeIterators(ds, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **common)


def cpu_decode_where(cfg: Config, bundle: DataBundle, info: DistInfo) -> str:
    """Where the CPU decoder runs, as `_host_loader` resolves --workers: a line saying "in worker processes" beside
    --workers 0 was untrue."""
    if cfg.data.workers == 0:
        return "in the main process (--workers 0)"
    if cfg.data.workers > 0:
        n = loader_workers(cfg, bundle.train, info)
        return f"in {n} worker process(es) (--workers {cfg.data.workers})"
    n = auto_workers(bundle.train, info)
    return f"in {n} worker process(es) (auto: the usable cores less one per process on this machine, at most 16)"


def decode_line(cfg: Config, bundle: DataBundle, info: DistInfo) -> str:
    """Which decoder an image folder's photos get and why, for the run's log; empty otherwise."""
    if not isinstance(bundle.train, ImageFolderDataset):
        return ""
    device = info.device
    engines = jpeg_engines(cfg.data.decode, cfg.data.source, device)
    decoder, why = resolve_decode(cfg.data.decode, device.type == "cuda", engines)
    what = {
        "cpu": cpu_decode_where(cfg, bundle, info),
        "gpu": "torchvision nvJPEG on the device",
        "hardware": "the GPU's JPEG engines, nvJPEG's hardware backend",
        "nvimgcodec": "nvImageCodec",
        "nvimgcodec-workers": "nvImageCodec's hardware engines, driven from the worker processes (a GIL each)",
    }
    if device.type != "cuda":  # the GPU paths run on the CPU here (tests use them so): say what decodes
        what |= {
            "gpu": "the nvJPEG path without CUDA: torchvision decodes with libjpeg-turbo on the CPU",
            "nvimgcodec": "nvImageCodec without CUDA: its CPU backend",
            "nvimgcodec-workers": "nvImageCodec without CUDA: its CPU backend, in the worker processes",
        }
    # ResNet-50 on an H200 (benchmarks/results/2026-11-30-h200/speed_records_jpeg.csv): 6,592 img/s
    # from a prepared store against 4,526 decoding the same photos every epoch (nvJPEG)
    tip = prepare_then_train(cfg, bundle.shape[1])
    jpegs = f"; JPEGs: {cpu_jpeg_line()}" if decoder == "cpu" or cfg.data.cpu_share > 0 else ""
    return (
        f"decode: {decoder} ({what[decoder]}; {why}){jpegs}\n"
        f"photos are decoded again every epoch; decode them once: {tip}"
    )


def decodes_on_gpu(cfg: Config, bundle: DataBundle) -> bool:
    """Whether the photos of this run are decoded on the GPU (a `GpuDecoder` in the train loader)."""
    return (
        cfg.data.loader != "textbook"  # the textbook loader decodes per sample on the host
        and isinstance(bundle.train, ImageFolderDataset)
        and cfg.data.decode in ("gpu", "hardware", "nvimgcodec")
    )


SHUFFLE_KEY = -1  # no sample's index: the crops keyed by (seed, index) never share a generator's seed with the order


def shuffle_seed(seed: int) -> int:
    """The train sampler's seed for the run's `seed`. DistributedSampler permutes by seed + epoch: given the run's
    seed itself, seed s + 1 trained in seed s's order shifted by one epoch (epoch e of s + 1 was epoch e + 1 of s),
    so the seeds s, s + 1, ... that `bench --time-to-accuracy` repeats over shared all their orders but one.
    Hashed (below 2**63, so + epoch stays below torch's 2**64), two seeds' orders are as unrelated as two seeds'."""
    return mix_seed(seed, SHUFFLE_KEY)


def build_loader(bundle: DataBundle, cfg: Config, info: DistInfo, train: bool) -> DeviceFeeder:
    """The train loader (shuffled; the ranks' shares cut to equal length, not padded, but for a set smaller than
    the world) or the eval loader (exact shards)."""
    ds = bundle.train if train else bundle.val
    batch_size = cfg.run.batch_size
    augment = resolve_augment(cfg.data.augment, bundle.shape, bundle.loader_crops, bundle.grey) if train else "none"
    textbook = cfg.data.loader == "textbook"
    min_scale = cfg.data.crop_min_scale  # of every random-resized crop drawn below (training only)
    if train:
        # drop_last: the ranks' shares are cut to equal length (fewer than world-size samples left out, other ones
        # each epoch) rather than padded with repeats, which were trained twice and counted in the epoch's loss,
        # accuracy and images; a set smaller than the world is padded, as it must be to give each rank one
        sampler = DistributedSampler(
            ds,
            info.world_size,
            info.rank,
            shuffle=True,
            seed=shuffle_seed(cfg.run.seed),
            drop_last=len(ds) >= info.world_size,
        )
        drop_last = len(sampler) >= batch_size
    else:
        sampler, drop_last = ShardSampler(len(ds), info.rank, info.world_size), False
    transform = DeviceTransform(
        bundle.mean,
        bundle.std,
        "none" if textbook else augment,
        cfg.speed.channels_last == "on",
        info.device,
        seed=cfg.run.seed + info.rank,
        num_samples=len(ds),
        flip_seed=cfg.run.seed,  # not + rank: a sample's flip must not depend on the rank that draws it
    )
    decoder = None
    if textbook:
        ds = TextbookDataset(ds, bundle.mean, bundle.std, augment, train, min_scale)
    elif isinstance(ds, ImageFolderDataset) and decodes_on_gpu(cfg, bundle):
        # workers only read bytes; decoding, random-resized crop and resize happen on the device
        backend = {"gpu": "nvjpeg", "hardware": "hardware", "nvimgcodec": "nvimgcodec"}[cfg.data.decode]
        decoder = GpuDecoder(
            ds.files,
            ds.size,
            info.device,
            train,
            seed=cfg.run.seed + info.rank,
            resize=cfg.data.gpu_resize,
            backend=backend,
            min_scale=min_scale,
        )
        if cfg.data.cpu_share > 0:  # workers decode a share of every batch themselves
            flags = damage_flags_of(ds)
            ds = HybridFolder(ds.files, ds.labels, ds.size, train, cfg.data.cpu_share, min_scale, flags)
        else:
            ds = SlottedEncodedFolder(ds.files, ds.labels, ds.size)  # whole batches, in slots where given
    elif isinstance(ds, StoreDataset):
        # workers copy raw pixels (or, resident, nothing: batches are offsets); crops resized on the device
        resident = store_resident(cfg.data.resident, ds.store, info.device, RESIDENT_MEMORY_SHARE)
        decoder = StoreCropper(
            ds, info.device, train, seed=cfg.run.seed + info.rank, resident=resident, min_scale=min_scale
        )
        ds = ds.index_only() if resident else ds
    elif isinstance(ds, ImageFolderDataset) and cfg.data.decode == "cpu":
        # workers crop, resize, batch; a damaged photo is named once in the command, whatever loaders it builds
        ds = CpuDecodedFolder(
            ds.files, ds.labels, ds.size, train, min_scale=min_scale, named_damaged=damage_flags_of(ds)
        )
    elif isinstance(ds, ImageFolderDataset) and cfg.data.decode == "nvimgcodec-workers":
        # workers use the GPU
        ds = WorkerGpuDecodedFolder(ds.files, ds.labels, ds.size, train, info.device, min_scale=min_scale)
    if wants_resident(cfg, bundle, info.device):
        loader = ResidentLoader(ds, sampler, batch_size, drop_last, info.device, with_index=transform.needs_index)
    else:
        if transform.needs_index and decoder is None and not getattr(ds, "answers_batches", False):  # they carry them
            ds = WithIndex(ds)
        loader = _host_loader(ds, sampler, batch_size, drop_last, cfg, info, textbook)
        if decoder is not None and isinstance(ds, SlottedEncodedFolder):
            decoder.slots = ds.slots  # it reads the bytes in place and gives the slots back
    return DeviceFeeder(
        loader, sampler, transform, info.device, train, side_stream=cfg.data.prefetch_stream == "on", decoder=decoder
    )
