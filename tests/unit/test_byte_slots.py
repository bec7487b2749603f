"""Encoded batches in shared-memory slots made once per loader (data/byte_slots.py): the decoder reads the
same bytes as from a segment of their own, gives each slot back, and a batch without a slot or too big for
one travels the old way."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cnnpar.config import Config, DataConfig, RunConfig, resolve_for_device
from cnnpar.data import byte_slots, load_data
from cnnpar.data.byte_slots import ByteSlots, SlottedBatches
from cnnpar.data.loader import build_loader
from cnnpar.dist import DistInfo
from tests.datafiles import write_noise_jpegs

CPU = DistInfo(0, 0, 1, torch.device("cpu"))


def photo_folder(root, n: int = 24):
    return write_noise_jpegs(root, n, first_height=40, width=56)


def test_a_slot_holds_what_was_written_and_refuses_what_does_not_fit():
    slots = ByteSlots(3, 16)
    assert slots.write(0, [np.full(16, 7, dtype=np.uint8)]) == 16
    parts = [np.arange(5, dtype=np.uint8), np.arange(7, dtype=np.uint8) + 100]
    assert slots.write(1, parts) == 12
    assert slots.view(1, 12).tolist() == list(range(5)) + list(range(100, 107))
    assert slots.view(0, 16).tolist() == [7] * 16  # the slot before untouched
    assert slots.write(2, [np.zeros(17, dtype=np.uint8)]) == -1
    taken = [slots.take() for _ in range(4)]
    assert sorted(t for t in taken if t is not None) == [0, 1, 2] and taken[3] is None  # none left: None
    slots.release(taken[0])
    slots.release(taken[0])  # twice: still one slot
    assert slots.free_count() == 1
    batches = SlottedBatches([[0, 1], [2, 3]], slots)
    assert list(batches) == [([0, 1], 2), ([2, 3], 1)]  # a pass starts with every slot free
    assert slots.free_count() == 1  # two of three taken by the pass


def epoch_batches(feeder, epoch: int, limit: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    feeder.set_epoch(epoch, 1000 + epoch)
    out = []
    for x, y in feeder:
        out.append((x.clone(), y.clone()))
        if limit is not None and len(out) == limit:
            break
    return out


@pytest.mark.parametrize("train", [True, False])
def test_batches_from_slots_equal_those_from_segments_of_their_own_and_every_slot_comes_back(
    tmp_path, monkeypatch, train
):
    root = photo_folder(tmp_path / "photos")
    data = DataConfig(source=str(root), image_size=24, decode="gpu", workers=2, val_fraction=0.25)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cpu", False)
    bundle = load_data(cfg.data)
    released = []
    real_release = ByteSlots.release
    monkeypatch.setattr(ByteSlots, "release", lambda self, s: (released.append(s), real_release(self, s)))

    monkeypatch.setattr(byte_slots, "ENABLED", False)
    plain = build_loader(bundle, cfg, CPU, train=train)
    assert plain.decoder.slots is None
    want = [epoch_batches(plain, e) for e in (1, 2)]
    plain.close()

    monkeypatch.setattr(byte_slots, "ENABLED", True)
    feeder = build_loader(bundle, cfg, CPU, train=train)
    slots = feeder.decoder.slots
    assert slots is not None and slots.count == 2 * feeder.loader.prefetch_factor + 2  # the batches in flight, and 2
    assert slots.describe().startswith(f"{slots.count} shared slots of ") and slots.describe().endswith("made once")
    got = [epoch_batches(feeder, e) for e in (1, 2)]
    assert len(released) == sum(len(b) for b in got)  # every batch came in a slot and gave it back
    assert slots.free_count() == slots.count
    feeder.close()
    for a, b in zip(want, got, strict=True):
        assert len(a) == len(b) > 0
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def slotted_loader(tmp_path, monkeypatch, count: int, slot_bytes):
    """A train feeder over 24 photos whose decoder records, per batch it gets, whether the bytes lay in a slot."""
    root = photo_folder(tmp_path / "photos")
    data = DataConfig(source=str(root), image_size=24, decode="gpu", workers=2, val_fraction=0.25)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cpu", False)
    bundle = load_data(cfg.data)
    monkeypatch.setattr(byte_slots, "ENABLED", True)
    size = slot_bytes(bundle)
    monkeypatch.setattr(byte_slots, "plan_slots", lambda files, b, wanted: (count, size, ""))
    feeder = build_loader(bundle, cfg, CPU, train=True)
    arrived = []
    real_stage = type(feeder.decoder).decode_stage
    monkeypatch.setattr(
        type(feeder.decoder), "decode_stage", lambda self, b: (arrived.append(b.flat is None), real_stage(self, b))[1]
    )
    return feeder, arrived, bundle, cfg


def test_a_pass_left_early_hands_its_slots_to_the_next(tmp_path, monkeypatch):
    # 3 slots, fewer than the batches the loader dispatches at once (2 workers x 4 + ...): a pass's first
    # three batches get one. The first pass takes one batch and is left with two slots still taken.
    feeder, arrived, _, _ = slotted_loader(tmp_path, monkeypatch, 3, lambda bundle: 1 << 20)
    assert epoch_batches(feeder, 1, limit=1)
    arrived.clear()
    got = epoch_batches(feeder, 2)
    assert len(got) == 4 and arrived == [True, True, True, False]  # without the pass's reset: one slot only
    assert feeder.decoder.slots.free_count() == 3  # each decoded batch gave its slot back
    feeder.close()


def test_a_batch_too_big_for_its_slot_travels_the_old_way_with_the_same_pixels(tmp_path, monkeypatch):
    def average_batch(bundle) -> int:  # slots the size of an average batch: the larger ones do not fit
        return int(np.mean([f.stat().st_size for f in bundle.train.files]) * 4)

    feeder, arrived, bundle, cfg = slotted_loader(tmp_path, monkeypatch, 40, average_batch)
    got = epoch_batches(feeder, 2)
    assert feeder.decoder.slots.free_count() == 40
    feeder.close()
    assert True in arrived and False in arrived  # some batches fitted their slot, some did not
    monkeypatch.setattr(byte_slots, "ENABLED", False)
    plain = build_loader(bundle, cfg, CPU, train=True)
    want = epoch_batches(plain, 2)
    plain.close()
    assert len(got) == len(want)
    for (xa, ya), (xb, yb) in zip(want, got, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_the_host_side_probe_gives_back_the_slots_of_the_batches_it_reads(tmp_path, monkeypatch):
    from cnnpar.bench.probes import HostSide

    feeder, arrived, _, _ = slotted_loader(tmp_path, monkeypatch, 40, lambda bundle: 1 << 20)
    feeder.set_epoch(1)
    assert len(list(HostSide(feeder))) == 4 and arrived == []  # read, never decoded
    assert feeder.decoder.slots.free_count() == 40  # before any new pass resets them
    feeder.close()


def test_no_slots_without_persistent_workers_or_without_workers(tmp_path):
    root = photo_folder(tmp_path / "photos", n=12)
    for workers, persistent in ((0, True), (2, False)):
        data = DataConfig(source=str(root), image_size=24, decode="gpu", workers=workers, persistent_workers=persistent)
        cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4)), "cpu", False)
        feeder = build_loader(load_data(cfg.data), cfg, CPU, train=True)
        assert feeder.decoder.slots is None
        feeder.set_epoch(1)
        assert sum(len(y) for _, y in feeder) > 0
        feeder.close()


def kilobyte_files(folder, n: int = 10) -> list:
    for i in range(n):
        (folder / f"{i}.jpg").write_bytes(b"x" * 1000)
    return [folder / f"{i}.jpg" for i in range(n)]


def test_the_slot_plan_fits_the_memory_budget(tmp_path, monkeypatch):
    files = kilobyte_files(tmp_path)
    monkeypatch.setattr(byte_slots, "host_memory_bytes", lambda: 1 << 40)
    monkeypatch.setattr(byte_slots, "shm_free_bytes", lambda: 1 << 40)
    count, slot, why = byte_slots.plan_slots(files, 100, wanted=6)
    assert (count, slot, why) == (6, 151552, "")  # 100 x 1000 x 1.5, rounded up to whole pages
    monkeypatch.setattr(byte_slots, "shm_free_bytes", lambda: 4 * 151552)  # half of it for the slots: two
    count, _, why = byte_slots.plan_slots(files, 100, wanted=6)
    assert count == 2 and why.startswith("2 of 6 slots")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode", ["gpu", "hardware"])
def test_on_cuda_slotted_batches_decode_to_the_same_pixels_and_give_their_slots_back(tmp_path, monkeypatch, decode):
    from cnnpar.data.nvjpeg_hw import hardware_decoder_available

    if decode == "hardware" and hardware_decoder_available(0):
        pytest.skip("this GPU has no JPEG engines for nvJPEG's hardware backend")
    root = photo_folder(tmp_path / "photos")
    data = DataConfig(source=str(root), image_size=24, decode=decode, workers=2, val_fraction=0.25)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cuda", False)
    bundle = load_data(cfg.data)
    info = DistInfo(0, 0, 1, torch.device("cuda", 0))
    runs = []
    for enabled, locked in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(byte_slots, "ENABLED", enabled)
        monkeypatch.setattr(byte_slots, "PAGE_LOCK", locked)
        feeder = build_loader(bundle, cfg, info, train=False)  # centre crops: the same pixels both ways
        runs.append(epoch_batches(feeder, 1))
        if enabled:
            slots = feeder.decoder.slots
            assert slots.free_count() == slots.count
            assert slots.locked == ("page-locked" if locked else "")
        feeder.close()
        if enabled:
            assert slots.locked == ""  # unregistered while the buffer lives
    for run in runs[1:]:
        for (xa, ya), (xb, yb) in zip(runs[0], run, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


class FakeCudart:
    def __init__(self, answer: int = 0) -> None:
        self.answer, self.calls = answer, []

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 - CUDA's name
        self.calls.append((ptr, size, flags))
        return self.answer

    def cudaHostUnregister(self, ptr):  # noqa: N802 - CUDA's name
        self.calls.append((ptr,))
        return 0


@pytest.mark.parametrize("answer", [0, 2])
def test_slots_are_page_locked_once_only_when_asked_and_a_refusal_is_said(monkeypatch, answer):
    cudart = FakeCudart(answer)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(byte_slots, "PAGE_LOCK", False)
    ByteSlots(2, 4096).page_lock_once()
    assert cudart.calls == []  # the default: pageable
    monkeypatch.setattr(byte_slots, "PAGE_LOCK", True)
    slots = ByteSlots(2, 4096)
    slots.page_lock_once()
    slots.page_lock_once()
    assert cudart.calls == [(slots.buffer.data_ptr(), 2 * 4096, 0)]
    if answer == 0:
        assert slots.describe().endswith("made once, page-locked")
    else:
        assert "page-lock refused (2)" in slots.describe()
    slots.unlock()
    slots.unlock()
    unregistered = [(slots.buffer.data_ptr(),)] if answer == 0 else []  # only a range that was registered
    assert cudart.calls[1:] == unregistered
    assert slots.describe().endswith("made once")


def test_the_slot_budget_is_split_between_a_nodes_processes_and_a_full_shm_falls_back(tmp_path, monkeypatch):
    from cnnpar.data import loader

    files = kilobyte_files(tmp_path)
    monkeypatch.setattr(byte_slots, "host_memory_bytes", lambda: 1 << 40)
    monkeypatch.setattr(byte_slots, "shm_free_bytes", lambda: 8 * 151552)  # half of it: four slots
    assert byte_slots.plan_slots(files, 100, wanted=6)[0] == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two ranks of this node plan at once: two each
    assert byte_slots.plan_slots(files, 100, wanted=6)[0] == 2

    def full(count, slot_bytes):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1>: No space left on device (28)")

    monkeypatch.setattr(loader, "ByteSlots", full)
    root = photo_folder(tmp_path / "photos", n=12)
    data = DataConfig(source=str(root), image_size=24, decode="gpu", workers=2)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4)), "cpu", False)
    feeder = build_loader(load_data(cfg.data), cfg, CPU, train=True)
    assert feeder.decoder.slots is None  # the old way, not a failed run
    feeder.set_epoch(1)
    assert sum(len(y) for _, y in feeder) > 0
    feeder.close()


def test_slots_are_planned_for_the_prefetch_the_loader_runs_not_the_one_asked_for(tmp_path, monkeypatch):
    """--prefetch-factor 10**9 is cut to the epoch's batches (loader_prefetch); the slots were planned for 10**9 x
    workers batches in flight, and took the whole memory budget of /dev/shm for batches that never came."""
    root = photo_folder(tmp_path / "photos")
    data = DataConfig(source=str(root), image_size=24, decode="gpu", workers=2, prefetch_factor=10**9)
    cfg = resolve_for_device(Config(data=data, run=RunConfig(batch_size=4, seed=3)), "cpu", False)
    monkeypatch.setattr(byte_slots, "ENABLED", True)
    feeder = build_loader(load_data(cfg.data), cfg, CPU, train=True)
    slots = feeder.decoder.slots
    assert feeder.loader.prefetch_factor < 10**9
    assert slots is not None and slots.count == 2 * feeder.loader.prefetch_factor + 2
    feeder.close()
