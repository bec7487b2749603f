"""Issue 13, item 1 on the CPU: Muon for the conv filters (torch.optim.Muon and the fallback), the
parameter split, the cifar10-record preset at a tiny size, the fast epoch indices, and the record
benchmark's plumbing (with a stand-in for airbench94_muon.py)."""

from __future__ import annotations

import copy
import importlib.util
import math
import signal
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.utils.data import DistributedSampler

from cnnpar.config import ConfigError, DataConfig, ModelConfig, OptimConfig, RunConfig, SpeedConfig
from cnnpar.data.loader import ShardSampler, epoch_indices
from cnnpar.dist import DistInfo
from cnnpar.engine import muon as muon_module
from cnnpar.engine.muon import MuonSGD, orthogonalize
from cnnpar.engine.optim import (
    apply_frozen_whitening,
    build_optimizer,
    describe_lr,
    muon_split,
    whitening_params,
)
from cnnpar.engine.trainer import Trainer
from cnnpar.models import build_model
from cnnpar.presets import get_preset
from cnnpar.report.files import read_csv
from tests.conftest import REPO, cli_env, run_cmd

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")
HAS_TORCH_MUON = hasattr(torch.optim, "Muon")


def _filters(channels_last: bool, seed: int = 0) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 6, 3, 3), (32, 16, 3, 3), (8, 2, 2, 2), (40, 3, 1, 1)]  # the last is taller than wide
    out = []
    for s in shapes:
        t = torch.randn(*s, generator=g)
        out.append(nn.Parameter(t.contiguous(memory_format=torch.channels_last) if channels_last else t))
    return out


def _muon(params, use_torch: bool, normalize: bool = False, lr: float = 0.1, decay: float = 0.0) -> MuonSGD:
    group = {"params": params, "muon": True, "lr": lr, "momentum": 0.6, "ns_steps": 3, "normalize": normalize}
    group["weight_decay"] = decay
    # bf16 iterations, torch.optim.Muon's arithmetic, which these tests compare with (a CPU without native bf16
    # iterates in fp32 by default: test_the_iteration_runs_in_fp32_on_a_cpu_that_emulates_bf16)
    return MuonSGD([group], use_torch_muon=use_torch, ns_dtype=torch.bfloat16)


def _grads(params, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in params]


# ---- Muon ------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_TORCH_MUON, reason="this torch has no torch.optim.Muon")
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_batched_step_takes_torch_muons_step_on_the_same_gradients(channels_last):
    """Three steps (momentum builds up) on the same gradients: the batched step's filters (one
    padded batch of four shapes, a tall matrix among them) end where torch.optim.Muon (given 2-D
    views) puts them, and where a plain torch.optim.Muon over the reshaped matrices puts them."""
    mine, theirs = _filters(channels_last), _filters(channels_last)
    plain = [nn.Parameter(p.detach().reshape(p.shape[0], -1).clone()) for p in _filters(False)]
    fallback, with_torch = _muon(mine, use_torch=False, decay=0.5), _muon(theirs, use_torch=True, decay=0.5)
    reference = torch.optim.Muon(plain, lr=0.1, weight_decay=0.5, momentum=0.6, nesterov=True, ns_steps=3)
    assert with_torch._inner is not None and fallback._inner is None
    for step in range(3):
        for group, opt in ((mine, fallback), (theirs, with_torch), (plain, reference)):
            for p, g in zip(group, _grads(mine, seed=step)):
                p.grad = torch.empty_like(p).copy_(g.reshape(p.shape))  # laid out like its parameter
            opt.step()
    for a, b, c in zip(mine, theirs, plain):
        assert a.stride() == b.stride()  # updated in place, layout kept
        # the same bf16 operations in the same order; a channels_last view sums its columns in
        # another order, which moves the last bf16 bit
        tol = 1e-6 if not channels_last else 2e-3
        assert torch.allclose(a, b, atol=tol, rtol=0), (a - b).abs().max()
        assert torch.allclose(a.detach().reshape(c.shape), c.detach(), atol=tol, rtol=0)
    assert all((a - b).abs().max() > 0.01 for a, b in zip(mine, _filters(channels_last)))  # they did move


@pytest.mark.parametrize("native", [False, True], ids=["emulated-bf16", "native-bf16"])
def test_the_iteration_runs_in_fp32_on_a_cpu_that_emulates_bf16(monkeypatch, native):
    """oneDNN emulates bf16 products on a CPU without AVX512-BF16 or AMX: there an iteration on fastnet's filters
    took 75x fp32's time, 99 % of a cifar10-record step. GPUs and CPUs with native bf16 keep torch.optim.Muon's bf16;
    the step with no dtype given takes the device's, and fp32 lands within bf16's precision of bf16."""
    monkeypatch.setattr(muon_module, "_cpu_bf16", lambda: native)
    assert muon_module.ns_dtype(CPU) == (torch.bfloat16 if native else torch.float32)
    assert muon_module.ns_dtype(torch.device("cuda", 0)) == torch.bfloat16
    ends = {}
    for dtype in (None, torch.float32, torch.bfloat16):
        params = _filters(channels_last=False)
        opt = MuonSGD([{"params": params, "muon": True, "lr": 0.1, "momentum": 0.6}], ns_dtype=dtype)
        for step in range(2):
            for p, g in zip(params, _grads(params, seed=step)):
                p.grad = g
            opt.step()
        ends[dtype] = params
    default = torch.bfloat16 if native else torch.float32
    assert all(torch.equal(a, b) for a, b in zip(ends[None], ends[default]))  # the device's dtype, not another
    for a, b in zip(ends[torch.float32], ends[torch.bfloat16]):
        assert 0 < (a - b).abs().max() < 2e-2  # two arithmetics, one update


def test_orthogonalize_evens_out_the_singular_values():
    torch.manual_seed(0)
    u, _, v = torch.linalg.svd(torch.randn(64, 216), full_matrices=False)
    for g in (torch.randn(64, 216), torch.randn(200, 40), u @ torch.diag(torch.logspace(0, -2, 64)) @ v):
        before = torch.linalg.svdvals(g)
        after = torch.linalg.svdvals(orthogonalize(g, steps=3).float())
        assert after.shape == before.shape and orthogonalize(g, 3).shape == g.shape
        assert after.max() < 1.3  # not converged to exactly one, by design, but near it
        spread, was = after.max() / after.min(), before.max() / before.min()
        assert spread < max(2.0, was / 10) and spread < was  # condition 3 -> 1.7, 100 -> 8
    with pytest.raises(ValueError, match="2-D"):
        orthogonalize(torch.randn(2, 3, 4), 3)


def test_normalize_rescales_each_filter_bank_to_norm_sqrt_out_before_the_step():
    for use_torch in (False, True) if HAS_TORCH_MUON else (False,):
        params = _filters(channels_last=True)
        opt = _muon(params, use_torch=use_torch, normalize=True, lr=1e-12)  # a step too small to see
        for p, g in zip(params, _grads(params, 1)):
            p.grad = g.contiguous(memory_format=torch.channels_last)
        opt.step()
        for p in params:
            assert p.norm().item() == pytest.approx(math.sqrt(p.shape[0]), rel=1e-5)


@pytest.mark.parametrize("use_torch", [False, True] if HAS_TORCH_MUON else [False])
def test_a_restored_muon_optimizer_continues_exactly(use_torch):
    def run(params, opt, seeds):
        for s in seeds:
            for p, g in zip(params, _grads(params, s)):
                p.grad = g.contiguous(memory_format=torch.channels_last)
            opt.step()

    a = _filters(channels_last=True)
    opt_a = _muon(a, use_torch)
    run(a, opt_a, [0, 1])
    b = [nn.Parameter(p.detach().clone()) for p in a]
    opt_b = _muon(b, use_torch)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as through a checkpoint file: no shared buffers
    run(a, opt_a, [2])
    run(b, opt_b, [2])
    for p, q in zip(a, b):
        assert torch.equal(p, q)


# ---- the split -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fastnet", "resnet18"])
def test_every_trainable_4d_filter_goes_to_muon_exactly_once(name):
    model = build_model(name, 3, 10, 32).to(memory_format=torch.channels_last)
    fast = name == "fastnet"
    cfg = OptimConfig(optimizer="muon", whiten_frozen=fast, whiten_bias_epochs=3 if fast else 0, bias_decay=True)
    apply_frozen_whitening(model, cfg)
    opt = build_optimizer(model, cfg, 0.5, CPU)
    seen = [p for g in opt.param_groups for p in g["params"]]
    assert len(seen) == len({id(p) for p in seen})  # nothing twice
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for p in seen} == trainable  # nothing left out, nothing frozen
    muon = [p for g in opt.param_groups if g["muon"] for p in g["params"]]
    assert {id(p) for p in muon} == {id(p) for p in model.parameters() if p.requires_grad and p.ndim == 4}
    assert all(not g["muon"] for g in opt.param_groups[:-1]) and opt.param_groups[-1]["muon"]
    assert opt.param_groups[0]["lr"] == 0.5  # the group --lr names comes first (the run's log reports it)
    if fast:  # the frozen whitened stem trains not at all; its bias in its own group, not Muon's
        weight, bias = whitening_params(model, cfg)
        assert id(weight) not in {id(p) for p in seen}
        assert [g.get("name") for g in opt.param_groups].count("whiten_bias") == 1
        assert model.head.weight in opt.param_groups[0]["params"]
    filters, decay, no_decay = muon_split(model)  # with no bias held, the held one is among the biases
    assert len(filters) + len(decay) + len(no_decay) == len(trainable)


def test_bias_decay_shrinks_every_group_by_the_same_share_per_step():
    model = build_model("fastnet", 3, 10, 32)
    for on in (False, True):
        cfg = OptimConfig(optimizer="muon", lr=1.5, weight_decay=2e-3, bias_lr_scale=64.0, bias_decay=on)
        weights, biases, muon = build_optimizer(model, cfg, cfg.lr, CPU).param_groups
        assert muon["weight_decay"] == 0.0  # normalised filters (or none at all) instead
        if on:
            assert biases["lr"] * biases["weight_decay"] == pytest.approx(weights["lr"] * weights["weight_decay"])
        else:
            assert biases["weight_decay"] == 0.0


def test_muon_settings_are_checked_and_a_model_without_filters_is_refused():
    assert describe_lr(OptimConfig(optimizer="muon", lr=0.5, muon_lr=0.3), 1).endswith("; conv filters: Muon, lr 0.3")
    with pytest.raises(ConfigError, match="optim.muon_momentum"):
        OptimConfig(muon_momentum=1.0)
    with pytest.raises(ConfigError, match="optim.muon_ns_steps"):
        OptimConfig(muon_ns_steps=0)
    with pytest.raises(ConfigError, match=r"optim.optimizer \(--optimizer\) = 'muon'.*no trainable 4-D conv filters"):
        build_optimizer(nn.Sequential(nn.Flatten(), nn.Linear(4, 2)), OptimConfig(optimizer="muon"), 0.1, CPU)


# ---- the preset at a tiny size -----------------------------------------------------------------
def test_record_preset_learns_digits_at_a_tiny_size(tmp_path):
    """The whole recipe (Muon, bias decay, whitened stem, translate + alternating flip, TTA) on the
    built-in digits, 3 epochs of 4 steps of 64: far above chance (10 %; it reached 97 % here). The stem trains:
    grey digits set 8 of its 24 filters, and --whiten-frozen is refused where the rest would stay random."""
    base = get_preset("cifar10-record")
    cfg = replace(
        base,
        data=replace(base.data, source="digits"),
        optim=replace(base.optim, whiten_frozen=False),
        speed=SpeedConfig(device="cpu", compile="off", precision="fp32"),
        run=replace(
            base.run, epochs=3, batch_size=64, max_steps=4, eval_every=3, progress=False, out_dir=str(tmp_path)
        ),
    )
    assert cfg.optim.optimizer == "muon" and cfg.model.name == "fastnet"
    tr = Trainer(cfg, DistInfo(0, 0, 1, CPU), log=lambda *a, **k: None)
    assert isinstance(tr.optimizer, MuonSGD)
    for epoch in range(1, cfg.run.epochs + 1):
        tr.train_epoch(epoch)
    acc = tr.evaluate()["val_acc"]
    assert acc > 0.8, acc


# ---- epoch indices -----------------------------------------------------------------------------
class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def test_epoch_indices_are_the_samplers_own():
    for n in (1, 7, 1000):
        for world in (1, 3):
            for rank in range(world):
                for drop_last in (False, True):
                    for shuffle in (True, False):
                        s = DistributedSampler(_Sized(n), world, rank, shuffle=shuffle, seed=5, drop_last=drop_last)
                        s.set_epoch(3)
                        assert epoch_indices(s).tolist() == list(s), (n, world, rank, drop_last, shuffle)
                assert epoch_indices(ShardSampler(n, rank, world)).tolist() == list(ShardSampler(n, rank, world))
    assert epoch_indices([4, 2]).tolist() == [4, 2]  # any other sampler: its own list


# ---- the benchmark's plumbing --------------------------------------------------------------------
def _bench():
    spec = importlib.util.spec_from_file_location("cifar10_record", REPO / "benchmarks" / "cifar10_record.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


STAND_IN = """import os
assert os.path.exists("cifar10/train.pt") and os.path.exists("cifar10/test.pt")
def main(run):
    print("|  %s  |      0  |  0.5000  |  0.4000  |               |        0.1000  |" % str(run).rjust(6))
    acc, seconds = (0.1, 99.0) if run == "warmup" else (0.9 + run / 100, 1.3 + run / 10)
    print("|          |   eval  |  0.9630  |  0.8937  |  %.4f  |  %.4f  |" % (acc, seconds))
if __name__ == "__main__":
    main("warmup")
    accs = [main(run) for run in range(200)]
"""


def test_airbench_rows_are_read_from_its_own_table(tmp_path):
    """The stand-in prints airbench94_muon's table; the benchmark makes it run --seeds times (not
    200) from its folder with ./cifar10 linked to the data, and keeps one row per run."""
    folder, data = tmp_path / "airbench", tmp_path / "data"
    folder.mkdir()
    data.mkdir()
    (folder / "airbench94_muon.py").write_text(STAND_IN)
    for name in ("train.pt", "test.pt"):
        (data / name).write_bytes(b"")
    out = tmp_path / "res" / "rec.csv"
    cmd = [sys.executable, str(REPO / "benchmarks" / "cifar10_record.py"), "--device", "cpu", "--skip-cnnpar"]
    cmd += ["--seeds", "3", "--airbench-dir", str(folder), "--airbench-data", str(data), "--out", str(out)]
    proc = run_cmd(cmd, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = read_csv(out)
    assert [r["run"] for r in rows] == ["warmup", "0", "1", "2"]
    assert [float(r["val_acc"]) for r in rows[1:]] == [0.9, 0.91, 0.92]
    assert [float(r["total_s"]) for r in rows[1:]] == [1.3, 1.4, 1.5]
    assert all(r["system"] == "airbench94_muon" and r["status"] == "ok" and r["torch"] and r["git_rev"] for r in rows)
    assert "sha256:" in rows[0]["airbench_source"] and "--skip-cnnpar" in rows[0]["command"]
    md = out.with_suffix(".md").read_text()
    assert "| airbench94_muon | as published | 3 | 91.00 % (90.00-92.00) | 1.400 (1.300-1.500) |" in md


def test_a_call_killed_by_timeout_keeps_the_rows_it_has_and_stops_airbench(tmp_path):
    folder, data = tmp_path / "airbench", tmp_path / "data"
    folder.mkdir()
    data.mkdir()
    stuck = STAND_IN.replace('    main("warmup")\n', '    main("warmup")\n    import time; time.sleep(300)\n')
    (folder / "airbench94_muon.py").write_text(stuck)
    for name in ("train.pt", "test.pt"):
        (data / name).write_bytes(b"")
    out = tmp_path / "rec.csv"
    cmd = [sys.executable, "-u", str(REPO / "benchmarks" / "cifar10_record.py"), "--device", "cpu", "--skip-cnnpar"]
    cmd += ["--airbench-dir", str(folder), "--airbench-data", str(data), "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:  # until its warm-up row is out, then what `timeout` does
        if "|   eval  |" in line:
            break
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    rows = read_csv(out)
    assert [(r["system"], r["run"], r["status"]) for r in rows] == [("airbench94_muon", "warmup", "ok")]


def test_airbench_without_its_runs_line_or_its_data_is_skipped_with_the_reason(tmp_path):
    bench = _bench()
    folder, data = tmp_path / "airbench", tmp_path / "data"
    folder.mkdir()
    data.mkdir()
    rows = []
    bench.airbench_runs(folder, data, 2, None, 10.0, rows)
    assert rows[0]["status"] == "skipped" and "airbench94_muon.py: not found" in rows[0]["error"]
    (folder / "airbench94_muon.py").write_text("print('no runs line')\n")
    rows = []
    bench.airbench_runs(folder, data, 2, None, 10.0, rows)
    assert "train.pt: not found" in rows[0]["error"]
    for name in ("train.pt", "test.pt"):
        (data / name).write_bytes(b"")
    rows = []
    bench.airbench_runs(folder, data, 2, None, 10.0, rows)
    assert "for run in range(200)" in rows[0]["error"]


def test_variants_override_the_preset_and_bad_ones_name_the_item():
    bench = _bench()
    cfg = bench.variant_config(get_preset("cifar10-record"), "speed.compile=off,run.epochs=9,optim.bias_decay=false")
    assert (cfg.speed.compile, cfg.run.epochs, cfg.optim.bias_decay) == ("off", 9, False)
    with pytest.raises(SystemExit, match="section.field=value"):
        bench.parse_overrides("epochs=9")
    with pytest.raises(ConfigError, match="optim.muon_lr"):
        bench.variant_config(get_preset("cifar10-record"), "optim.muon_lr=-1")


def test_cnnpar_runs_time_the_whole_recipe_on_a_tiny_set(tmp_path):
    """A warm-up run and 2 seeds of the preset (shrunk) on 64 16x16 images: each row has its
    accuracy and the parts of its time, which add up to the total."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 96)
    x = (rng.integers(0, 40, (96, 16, 16, 3)) + 20 * y[:, None, None, None]).astype(np.uint8)
    np.savez(tmp_path / "tiny.npz", x_train=x[:64], y_train=y[:64], x_test=x[64:], y_test=y[64:])
    bench = _bench()
    base = get_preset("cifar10-record")
    base = replace(base, data=replace(base.data, source=str(tmp_path / "tiny.npz")))
    from cnnpar.data import load_data

    bundle = load_data(base.data, 0)
    variant = "speed.compile=off,speed.precision=fp32,speed.device=cpu,run.epochs=1,run.batch_size=32"
    rows = bench.cnnpar_runs(base, DistInfo(0, 0, 1, CPU), bundle, variant, 0, seeds=2)
    assert [r["run"] for r in rows] == ["warmup", 0, 1]
    for r in rows:
        assert r["status"] == "ok", r
        assert 0 <= r["val_acc"] <= 1 and r["whiten_s"] > 0 and r["train_s"] > 0 and r["eval_s"] > 0
        assert r["total_s"] == pytest.approx(r["whiten_s"] + r["train_s"] + r["eval_s"], rel=1e-6)
        assert 0 < r["launch_lead_s"] < r["train_s"]  # the epochs' ends, after their last launches
        assert "optimizer=muon" in r["resolved"] and r["graphs_compiled"] == 0  # compile off here


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_warm_up_captures_the_graph_so_the_first_epoch_replays_it(tmp_path):
    cfg = get_preset("cifar10-record")
    cfg = replace(
        cfg,
        data=DataConfig(source="synthetic", image_shape="3x32x32", synthetic_samples=512, resident="on"),
        model=ModelConfig(name="fastnet"),
        speed=replace(cfg.speed, compile="off", cuda_graphs="on"),
        run=RunConfig(epochs=1, batch_size=128, progress=False, out_dir=str(tmp_path)),
    )
    tr = Trainer(cfg, DistInfo(0, 0, 1, torch.device("cuda", 0)), log=lambda *a, **k: None)
    tr.warm_up_compile()
    graphs = dict(tr.train_step.graphs)
    assert [shape for shape, _ in graphs] == [(128, 3, 32, 32)]  # one epoch: the stem bias never freezes
    tr.train_epoch(1)
    assert tr.train_step.graphs == graphs  # replayed, not captured again


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_muon_sgd_on_cuda_takes_the_cpus_steps():
    """Muon groups (torch.optim.Muon where torch has it) and fused SGD groups on CUDA against the
    CPU's foreach path, three steps on the same gradients: the same weights to bf16's precision."""
    cuda = torch.device("cuda", 0)

    def build(device, impl):
        params = [nn.Parameter(p.detach().to(device)) for p in _filters(channels_last=True)]
        head = nn.Parameter(torch.linspace(-1, 1, 30).view(3, 10).to(device))
        bias = nn.Parameter(torch.zeros(16, device=device))
        groups = [
            {"params": [head], "weight_decay": 1e-2},
            {"params": [bias], "lr": 1.0, "weight_decay": 1e-4},
            {"params": params, "muon": True, "lr": 0.1, "momentum": 0.6, "normalize": True},
        ]
        # bf16 iterations on both (a host CPU without native bf16 would iterate in fp32)
        return [head, bias, *params], MuonSGD(groups, lr=0.5, momentum=0.85, impl=impl, ns_dtype=torch.bfloat16)

    cpu_params, cpu_opt = build(CPU, {"foreach": True})
    gpu_params, gpu_opt = build(cuda, {"fused": True})
    for step in range(3):
        for a, b, g in zip(cpu_params, gpu_params, _grads(cpu_params, step)):
            a.grad = torch.empty_like(a).copy_(g)
            b.grad = torch.empty_like(b).copy_(g.to(cuda))
        cpu_opt.step()
        gpu_opt.step()
    for a, b in zip(cpu_params, gpu_params):
        assert torch.allclose(a, b.cpu(), atol=5e-3, rtol=1e-3), (a - b.cpu()).abs().max()
