"""`cnnpar` subcommands: parse, build, run; nothing else. Clean-up happens in `finally`."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import warnings

from cnnpar.errors import UserError


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _user_error_text(e: UserError) -> str:
    # A DataLoader worker re-raises our error with its own traceback folded into the message;
    # the user needs only our last line.
    text = str(e)
    if "Original Traceback" in text:
        text = [ln for ln in text.splitlines() if ln.strip()][-1].split(": ", 1)[-1]
    return text


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.cliargs import config_from_args, passthrough_args
    from cnnpar.dist import destroy_distributed, init_distributed

    cfg = config_from_args(args)
    if cfg.dist.nproc > 0 and "RANK" not in os.environ:
        # The convenience launcher: hand the same command to torchrun for this one machine.
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={cfg.dist.nproc}",
            "-m",
            "cnnpar",
            *passthrough_args(argv, "--nproc"),
        ]
        print("cnnpar: launching", " ".join(cmd), flush=True)
        return subprocess.call(cmd)
    if cfg.dist.strategy == "horovod":
        from cnnpar.parallel.horovod import init_horovod, shutdown_horovod

        info, teardown = init_horovod(cfg.speed.device), shutdown_horovod
    else:
        info = init_distributed(cfg.speed.device, cfg.dist.debug_single, cfg.dist.timeout_s)
        teardown = destroy_distributed
    if not info.is_main:
        warnings.filterwarnings("ignore")  # rank 0 speaks for the job; others speak only on failure
    try:
        from cnnpar.engine.trainer import Trainer

        result = Trainer(cfg, info).fit()
        if info.is_main:
            best = result.summary.get("best_val_acc")
            best_text = f"best val acc {100 * best:.2f}% | " if best is not None else ""
            print(f"done: {best_text}run folder {result.run_dir}")
        return 0
    finally:
        teardown()


def cmd_predict(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.engine.predict import predict

    out = predict(args.checkpoint, args.data, args.out, args.batch_size, args.image_shape, args.device)
    print(f"wrote {out}")
    return 0


def cmd_models(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.models import describe_models

    rows = describe_models()
    width = max(len(n) for n, _ in rows)
    for name, desc in rows:
        print(f"{name:<{width}}  {desc}")
    return 0


def cmd_compare(args: argparse.Namespace, argv: list[str]) -> int:
    from cnnpar.frameworks.compare import main_from_args

    return main_from_args(args)


def build_parser() -> argparse.ArgumentParser:
    from cnnpar.cliargs import add_config_flags

    p = argparse.ArgumentParser(prog="cnnpar", description="Fast CNN training, measured.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    train = sub.add_parser("train", help="train a model (defaults: cnn3 on the built-in digits)")
    add_config_flags(train)
    train.set_defaults(func=cmd_train)

    pred = sub.add_parser("predict", help="predict with a checkpoint; CSV input gives a Kaggle submission.csv")
    pred.add_argument("--checkpoint", required=True, help="a run folder, its ckpt/ folder, or a .pt file")
    pred.add_argument("--data", required=True, help="test.csv (pixel columns), an .npz, or an image folder")
    pred.add_argument(
        "--out", default="", help="output CSV (default: submission.csv for CSV input, else predictions.csv)"
    )
    pred.add_argument("--batch-size", type=int, default=256)
    pred.add_argument("--image-shape", default="", help="CxHxW of CSV rows when not square grey")
    pred.add_argument("--device", default="cpu")
    pred.set_defaults(func=cmd_predict)

    from cnnpar.frameworks.compare import add_compare_args

    comp = sub.add_parser("compare", help="train cnn3 under other frameworks, each in its own process, side by side")
    add_compare_args(comp)
    comp.set_defaults(func=cmd_compare)

    models = sub.add_parser("models", help="list the registered models")
    models.set_defaults(func=cmd_models)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args, argv[1:])
    except UserError as e:
        prefix = f"[rank {_rank()}] " if "RANK" in os.environ and os.environ.get("WORLD_SIZE", "1") != "1" else ""
        print(f"cnnpar: error: {prefix}{_user_error_text(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("cnnpar: interrupted", file=sys.stderr)
        return 130
    except BaseException:
        if "RANK" in os.environ:
            print(f"cnnpar: rank {_rank()} failed:", file=sys.stderr, flush=True)
        raise
