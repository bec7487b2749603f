"""The file lists that DataLoader workers read (`folder.PathTable`): the same paths as the list they come from,
held without a Python object per file, so that forked workers reading them over an epoch do not each copy the
parent's list of Paths (a reference count and a cached string written per file read: 86 MB a worker for 400,000
files, measured in a fork)."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest
import torch

from cnnpar.data.cpu_decode import CpuDecodedFolder
from cnnpar.data.folder import ImageFolderDataset, PathTable
from cnnpar.data.gpu_decode import EncodedFolderDataset
from cnnpar.data.store_feed import PreparedFolder
from cnnpar.data.worker_gpu_decode import WorkerGpuDecodedFolder


def paths() -> list[Path]:
    # a name that is not UTF-8 (as Linux keeps it, read back as surrogates), one that is, and a plain one
    latin1 = os.fsdecode(b"/data/cat/caf\xe9.png")
    return [Path("/data/cat/a.jpg"), Path(latin1), Path("/data/chat/été.JPEG"), Path("rel/b.png")]


def test_a_table_reads_as_the_list_it_was_made_of():
    files = paths()
    table = PathTable(files)
    assert len(table) == len(files)
    assert list(table) == files
    assert [table[i] for i in range(-len(files), 0)] == files
    assert table[1::2] == files[1::2] and table[::-1] == files[::-1]
    assert list(table.take([3, 0, 0])) == [files[3], files[0], files[0]]
    assert list(PathTable(table)) == files
    assert list(pickle.loads(pickle.dumps(table))) == files  # spawned workers get it pickled
    with pytest.raises(IndexError):
        table[len(files)]
    assert list(PathTable([])) == [] and len(PathTable([])) == 0


def test_two_tables_add_up_to_a_list_as_the_lists_they_replace_did():
    """`bundle.train.files + bundle.val.files` on an image folder's data (a notebook's, two tests') raised TypeError
    once its data set held a table."""
    a, b = PathTable([Path("x/1.jpg"), Path("x/2.jpg")]), PathTable([Path("y/3.png")])
    assert a + b == [Path("x/1.jpg"), Path("x/2.jpg"), Path("y/3.png")]
    assert [Path("z.jpg")] + b == [Path("z.jpg"), Path("y/3.png")]
    assert a + [Path("z.jpg")] == [Path("x/1.jpg"), Path("x/2.jpg"), Path("z.jpg")]
    with pytest.raises(TypeError):
        a + "x/4.jpg"


@pytest.mark.parametrize(
    "make",
    [
        lambda files: CpuDecodedFolder(files, [0] * len(files), 16, True),
        lambda files: EncodedFolderDataset(files, [0] * len(files), 16),
        lambda files: PreparedFolder(files, 16, 0, 0),
        lambda files: WorkerGpuDecodedFolder(files, [0] * len(files), 16, True, torch.device("cpu")),
        # the textbook loader hands it to its workers as it is (in a TextbookDataset): its list was copied by each
        lambda files: ImageFolderDataset(files, [0] * len(files), 16),
    ],
    ids=["cpu-decode", "encoded-bytes", "prepare", "worker-gpu-decode", "image-folder"],
)
def test_a_worker_data_set_holds_no_path_object_of_its_list(make):
    files = paths()
    before = [sys.getrefcount(f) for f in files]
    ds = make(files)
    # a data set that kept `list(files)` held a reference to each Path, which a forked worker's reads write to
    assert [sys.getrefcount(f) for f in files] == before
    assert [ds.files[i] for i in range(len(ds))] == files


def test_the_hybrid_decoders_two_halves_share_one_table():
    """HybridFolder's CPU half and its encoded half read the same files: each made its own table from the list,
    twice the time and memory (2.5 s and 85 MiB for ImageNet's 1.28 million paths)."""
    import numpy as np

    from cnnpar.data.hybrid_decode import HybridFolder

    files = paths()
    hybrid = HybridFolder(files, [0] * len(files), 16, True, 0.5)
    assert list(hybrid.cpu.files) == list(hybrid.encoded.files) == files
    assert np.shares_memory(hybrid.cpu.files._bytes, hybrid.encoded.files._bytes)


def test_an_image_folders_subsets_share_its_table():
    """The train and validation subsets of a folder (and the readers made from them) read the folder's one table."""
    import numpy as np

    files = paths()
    full = ImageFolderDataset(files, [0, 1, 0, 1], 16)
    part = full.subset(torch.tensor([3, 1]))
    assert list(part.files) == [files[3], files[1]] and part.labels.tolist() == [1, 1]
    assert np.shares_memory(part.files._bytes, full.files._bytes)
    assert len(full.subset(torch.tensor([], dtype=torch.int64))) == 0
