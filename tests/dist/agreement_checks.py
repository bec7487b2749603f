"""Ranks given other settings or another checkpoint stop together, with one line (tests/dist/test_rank_agreement.py).

Run as `torchrun --nproc_per_node=2 tests/dist/agreement_checks.py OUT_DIR` (gloo on the CPU; NCCL on two GPUs
with AGREEMENT_DEVICE=cuda). Each rank works in OUT_DIR/n<R>, as
each node of a multi-node job has its own working folder and disk, and writes OUT_DIR/rank<R>.json with each
check's exit code and stderr.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from cnnpar.cli import main as cli_main
from cnnpar.report.files import write_json_atomic
from tests.datafiles import bar_images, write_image_folder, write_pixel_csv

# AGREEMENT_DEVICE=cuda runs the same checks on GPUs through NCCL (tests/dist/test_gpu_ddp.py)
RUN = ["train", "--device", os.environ.get("AGREEMENT_DEVICE", "cpu")]
RUN += ["--batch-size", "16", "--no-progress", "--no-tensorboard", "--timeout-s", "60", "--name", "w"]
SYNTHETIC = ("--data", "synthetic", "--image-shape", "1x8x8", "--synthetic-samples", "64")


def train(*args: str, data: tuple[str, ...] = SYNTHETIC) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli_main([*RUN, *data, *args])
        except Exception as e:  # a rank left alone in a collective (before the ranks agreed on a data error)
            rc = f"raised {type(e).__name__}"
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue(), "initialized_after": dist.is_initialized()}


def this_nodes_photos(rank: int) -> str:
    """photos/ in this rank's folder: node 1's copy has two pictures of two classes swapped, under the same names (two
    wrong labels), which the listing's checksum of names and classes passes."""
    root = write_image_folder(Path("photos"), per_class=6, side=16)
    if rank == 1:
        a, b = next(
            (a, b)
            for a in sorted((root / "class0").glob("*.jpg"))
            for b in sorted((root / "class1").glob("*.jpg"))
            if a.stat().st_size != b.stat().st_size
        )
        pictures = a.read_bytes(), b.read_bytes()
        a.write_bytes(pictures[1])
        b.write_bytes(pictures[0])
    return str(root)


def a_shared_folder_seen_elsewhere(rank: int) -> str:
    """The --out-dir of this node: node 0's `shared`, which node 1 sees as `view` (a link to it; a shared file
    system mounted at another path), where node 0's relative path `shared` names nothing."""
    if rank == 1:
        Path("view").symlink_to(Path("..", "n0", "shared"))
        return "view"
    Path("shared").mkdir()
    return "shared"


def this_nodes_csv(rank: int) -> str:
    """u.csv in this rank's folder: node 1's copy has a cell that is not a number."""
    x, y = bar_images(64, side=8)
    path = write_pixel_csv(Path("u.csv"), x, y)
    if rank == 1:
        lines = path.read_text().splitlines()
        cells = lines[7].split(",")
        cells[1] = "abc"
        lines[7] = ",".join(cells)
        path.write_text("\n".join(lines) + "\n")
    return str(path)


def other_weights_in_this_nodes_copy(rank: int, work: Path) -> None:
    """Node 1's own copy of rank 0's run folder, whose checkpoint holds the same epoch with other weights."""
    if rank == 1:
        shutil.copytree(work / "n0" / "runs" / "w", work / "n1" / "runs" / "w")
        last = work / "n1" / "runs" / "w" / "ckpt" / "last.pt"
        state = torch.load(last, weights_only=False)
        for tensor in state["model"].values():
            if tensor.is_floating_point():
                tensor.add_(0.01)
        torch.save(state, last)


def main() -> None:
    work = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    os.chdir(work / f"n{rank}")
    results = {"lr": train("--epochs", "1", *(["--lr", "0.01"] if rank == 1 else []))}
    results["batch"] = train("--epochs", "1", *(["--batch-size", "8"] if rank == 1 else []))
    photos = ("--data", this_nodes_photos(rank), "--image-size", "8", "--workers", "0")
    results["photos"] = train("--epochs", "1", "--name", "photos", data=photos)
    out_dir = ["--out-dir", a_shared_folder_seen_elsewhere(rank), "--name", "sh"]
    results["elsewhere"] = train("--epochs", "1", *out_dir)
    results["elsewhere_auto"] = train("--epochs", "2", *out_dir, "--resume", "auto")
    results["elsewhere_path"] = train("--epochs", "3", *out_dir, "--resume", f"{out_dir[1]}/sh")
    results["too_small"] = train("--epochs", "1", "--image-size", "4")  # every rank refuses it alike
    results["first"] = train("--epochs", "1")  # agreed: rank 0 writes n0/runs/w
    done = work / "first-done"
    if rank == 0:
        done.touch()  # rank 0 has written its run folder and left its process group
    while not done.exists():
        time.sleep(0.05)
    other_weights_in_this_nodes_copy(rank, work)
    results["checkpoint"] = train("--epochs", "2", "--resume", "auto")
    if rank == 1:  # node 1's copy of the run folder lacks the checkpoint: rank 0's path names nothing there
        (work / "n1" / "runs" / "w" / "ckpt" / "last.pt").unlink()
    results["missing"] = train("--epochs", "2", "--resume", "auto")
    if rank == 1:  # node 1's disk has no copy of the run folder at all: its settings are the defaults, not the run's
        shutil.rmtree(work / "n1" / "runs" / "w")
    results["unshared"] = train("--epochs", "2", "--resume", "runs/w")
    results["unshared_auto"] = train("--epochs", "2", "--resume", "auto")
    # last: before the ranks agreed on it, rank 0 was left in a collective by rank 1 and raised there
    results["bad_data"] = train("--epochs", "1", "--data", this_nodes_csv(rank), "--name", "csv")
    write_json_atomic(work / f"rank{rank}.json", results)


if __name__ == "__main__":
    main()
