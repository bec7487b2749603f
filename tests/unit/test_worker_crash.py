"""What a DataLoader worker killed by a signal means (`data/worker_crash.py`): torch's error read back to the signal,
and the one line a run ends with (tests/integration/test_bad_input.py runs a real crash)."""

from __future__ import annotations

import signal

from cnnpar.data.worker_crash import worker_crash, worker_crash_line, worker_signal


def torch_errors(words: str) -> RuntimeError:
    """What torch raises for a worker killed by the signal `words` names: "exited unexpectedly" from the SIGCHLD
    handler's "is killed by signal" (as in a run whose worker met a damaged PNG)."""
    try:
        try:
            raise RuntimeError(f"DataLoader worker (pid 4242) is killed by signal: {words}. ")
        except RuntimeError as e:
            raise RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly") from e
    except RuntimeError as e:
        return e


def test_the_signal_is_read_from_torchs_error_or_the_one_it_was_raised_from():
    assert worker_signal(torch_errors("Segmentation fault")) == signal.SIGSEGV
    assert worker_signal(torch_errors("Killed")) == signal.SIGKILL
    assert worker_signal(RuntimeError("DataLoader worker (pid 7) is killed by signal: Bus error. ")) == signal.SIGBUS
    assert worker_signal(RuntimeError("DataLoader worker (pid(s) 7) exited unexpectedly")) is None
    assert worker_signal(RuntimeError("CUDA error: an illegal memory access was encountered")) is None
    assert worker_signal(ValueError("DataLoader worker (pid 7) is killed by signal: Segmentation fault. ")) is None


def test_a_crash_reading_photos_says_what_can_cause_it_and_the_command_that_finds_the_file():
    assert worker_crash_line(signal.SIGSEGV, "my photos", True, 224) == (
        "a data loader worker crashed (SIGSEGV: Segmentation fault) while reading my photos: a damaged image file "
        "can crash torchvision's decoders (libpng's or libjpeg's own line above may say how); to find it: cnnpar "
        "prepare 'my photos' --out 'my photos.cnnpar' --short-side 256 decodes every photo with Pillow and stops at "
        "one it cannot read, naming it (where it names none, it has written a store that trains without those "
        "decoders: cnnpar train --data 'my photos.cnnpar')"
    )


def test_a_worker_killed_outright_or_one_that_decodes_nothing_gets_no_advice_about_photos():
    oom = worker_crash_line(signal.SIGKILL, "photos", True, 224)
    assert oom.startswith("a data loader worker crashed (SIGKILL: Killed) while reading photos: SIGKILL is most ")
    assert "out-of-memory killer" in oom and "prepare" not in oom
    assert worker_crash_line(signal.SIGBUS, "d.cnnpar", False, 224) == (
        "a data loader worker crashed (SIGBUS: Bus error) while reading d.cnnpar"
    )


def test_a_bench_row_keeps_the_whole_line_with_the_command_that_finds_the_file():
    """A failed bench row's reason was cut at 300 characters: a crash reading photos lost the end of its advice,
    the command that finds the file (doctor and bench say the crash through `worker_crash`, as train does)."""
    from types import SimpleNamespace

    from cnnpar.bench.measure import error_text
    from cnnpar.data.folder import ImageFolderDataset

    photos = SimpleNamespace(train=ImageFolderDataset([], [], 224), shape=(3, 224, 224))
    crash = worker_crash(torch_errors("Segmentation fault"), "my photos", photos)
    assert str(crash) == worker_crash_line(signal.SIGSEGV, "my photos", True, 224) and len(str(crash)) > 300
    assert error_text(crash) == f"DataError: {crash}"
    assert worker_crash(torch_errors("Terminated"), "my photos", photos) is None  # the stop's doing: said as a stop
    assert worker_crash(RuntimeError("CUDA error: out of memory"), "my photos", photos) is None
    assert error_text(RuntimeError("x" * 400)) == "RuntimeError: " + "x" * 286  # torch's own: cut


def test_a_worker_killed_by_sigbus_reading_a_store_truncated_under_the_run_names_the_store_and_the_change(tmp_path):
    """A store truncated in place while workers had it mapped: a worker reading past the new end died of SIGBUS, and
    the run ended "a data loader worker crashed (SIGBUS: Bus error)" under torch's guess of a full /dev/shm."""
    import os
    from types import SimpleNamespace

    import torch

    from cnnpar.data.store import StoreFile
    from cnnpar.data.store_feed import StoreDataset
    from cnnpar.data.store_write import prepare_store
    from tests.datafiles import write_image_folder

    out = tmp_path / "d.cnnpar"
    prepare_store(write_image_folder(tmp_path / "d", per_class=2), out, 32, workers=1, progress=False)
    store = StoreFile(out)  # as the main process holds it: the workers map the pixels, it does not
    bundle = SimpleNamespace(train=StoreDataset(store, torch.arange(store.count), 16), shape=(3, 16, 16))
    untouched = worker_crash(torch_errors("Bus error"), str(out), bundle)
    assert str(untouched) == f"a data loader worker crashed (SIGBUS: Bus error) while reading {out}"
    os.truncate(out, store.header["data_start"])
    crash = str(worker_crash(torch_errors("Bus error"), str(out), bundle))
    assert crash.startswith(f"{out}: changed while this run read it (truncated: "), crash
    assert "SIGBUS" in crash and "\n" not in crash
