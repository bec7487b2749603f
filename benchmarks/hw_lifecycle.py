"""Does a process using the GPU's JPEG engines (cnnpar.data.nvjpeg_hw) start, decode and end cleanly?

Each scenario runs in a child process with a watchdog: if it has not ended after --timeout-s seconds,
faulthandler prints every thread's stack and the child exits, so a hang shows where it hangs.
A check of behaviour for a GPU machine, not a timing; prints one line per scenario.

    python benchmarks/hw_lifecycle.py --folder .devdata/imagenet_sample
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SCENARIOS = ("close_after_thread", "del_after_thread", "exit_with_decoder_open", "exit_with_thread_decoding", "probe")


def child(name: str, folder: str, timeout_s: float) -> None:
    import faulthandler
    import threading

    import torch

    faulthandler.dump_traceback_later(timeout_s, exit=True)
    from cnnpar.data.gpu_decode import EncodedFolderDataset, GpuDecoder, collate_encoded
    from cnnpar.data.nvjpeg_hw import hardware_decoder_available

    def mark(what: str) -> None:
        print(f"  {name}: {what}", flush=True)

    if name == "probe":
        mark(f"probe says {hardware_decoder_available(0)!r}")
        return
    files = sorted(p for p in Path(folder).rglob("*") if p.is_file())[:256]
    ds = EncodedFolderDataset(files, [0] * len(files), 224)
    batch, _ = collate_encoded([ds[i] for i in range(len(files))])
    dec = GpuDecoder(files, 224, torch.device("cuda"), True, backend="hardware")
    stop = threading.Event()

    def decode_loop(times: int) -> None:
        with torch.cuda.stream(torch.cuda.Stream()):
            k = 0
            while k < times and not stop.is_set():
                dec(batch)
                k += 1
        torch.cuda.synchronize()

    if name == "exit_with_thread_decoding":
        threading.Thread(target=decode_loop, args=(10**9,), daemon=True).start()
        time.sleep(2)
        mark("exiting while the thread decodes")
        return
    t = threading.Thread(target=decode_loop, args=(5,))
    t.start()
    t.join()
    mark(f"decoded 5 batches in a thread ({dec.hardware_decoded} images by the engines)")
    if name == "close_after_thread":
        dec.close()
        mark("closed")
    elif name == "del_after_thread":
        del dec
        import gc

        gc.collect()
        mark("deleted")
    mark("exiting")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default=".devdata/imagenet_sample")
    ap.add_argument("--timeout-s", type=float, default=25.0)
    ap.add_argument("--child", default="")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.folder, args.timeout_s)
        return
    for name in SCENARIOS:
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--child", name, "--folder", args.folder, "--timeout-s", str(args.timeout_s)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s + 30)
        except subprocess.TimeoutExpired:  # hung after the watchdog's time, late in its exit
            print(f"{name}: HUNG past {args.timeout_s + 30:.0f} s, killed", flush=True)
            continue
        hung = "Timeout" in r.stderr or "most recent call first" in r.stderr
        print(f"{name}: rc {r.returncode}, {time.perf_counter() - t0:.1f} s{', HUNG' if hung else ''}", flush=True)
        print(r.stdout.rstrip(), flush=True)
        if hung or r.returncode:
            print("\n".join(line for line in r.stderr.splitlines() if "Warning" not in line)[-4000:], flush=True)


if __name__ == "__main__":
    main()
