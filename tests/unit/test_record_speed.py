"""Issue 13, item 1: what the record preset's timed region no longer does, checked to train the same.

The augmentation runs on uint8 before the normalisation (the same floats), fastnet's last pool is
max_pool2d over the whole map (amax's values, the gradient to the index the forward picked), and the
whitened stem's bias stops needing a gradient once its epochs are over (the same weights: its lr was
already 0 then)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cnnpar.config import DataConfig, ModelConfig, RunConfig, SpeedConfig
from cnnpar.data.transforms import DeviceTransform, alternating_flip, random_crop, random_flip
from cnnpar.dist import DistInfo
from cnnpar.engine.optim import bias_to_freeze
from cnnpar.engine.trainer import Trainer
from cnnpar.models import build_model
from cnnpar.models.fastnet import LOGIT_SCALE
from cnnpar.presets import get_preset

pytestmark = pytest.mark.usefixtures("one_thread")
CPU = torch.device("cpu")


def _transform(augment: str, channels_last: bool) -> DeviceTransform:
    t = DeviceTransform((0.49, 0.48, 0.45), (0.25, 0.24, 0.26), augment, channels_last, CPU, 3, 64, 5)
    t.set_epoch(2)
    return t


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("augment", ["translate+altflip", "crop+flip", "none"])
def test_augmenting_uint8_before_normalising_gives_the_same_floats(augment, channels_last):
    x = torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)
    index = torch.randperm(64)
    got = _transform(augment, channels_last)(x, True, index)
    ref = _transform(augment, channels_last)  # the same seeds: the order the transform used to take
    want = torch.addcmul(ref.shift, x.float(), ref.scale)
    if ref.crop:
        want = random_crop(want, ref.pad, ref.generator)
    if ref.flip:
        want = random_flip(want, ref.generator)
    if ref.alt_bits is not None:
        want = alternating_flip(want, ref.alt_bits, index, ref.epoch)
    if channels_last:
        want = want.contiguous(memory_format=torch.channels_last)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert got.stride() == want.stride()  # channels_last where asked
    assert augment == "none" or not torch.equal(got, _transform("none", channels_last)(x, True, index))


def test_fastnet_pools_each_map_whole_and_sends_the_gradient_to_its_largest_value():
    torch.manual_seed(0)
    model = build_model("fastnet", 3, 10, 32)
    maps = torch.randn(4, model.head.in_features, 3, 3, requires_grad=True)  # 32x32 inputs end 3x3
    out = model.classify(maps)
    assert torch.allclose(out, model.head(torch.amax(maps, dim=(2, 3))) * LOGIT_SCALE)
    out.sum().backward()
    flat = maps.grad.flatten(2)
    assert ((flat != 0).sum(-1) == 1).all()  # one element per map gets the gradient: the largest
    assert torch.equal(flat.abs().argmax(-1), maps.detach().flatten(2).argmax(-1))


def _record(tmp_path, epochs: int):
    base = get_preset("cifar10-record")
    return replace(
        base,
        data=replace(base.data, source="synthetic", image_shape="3x16x16", synthetic_samples=96),
        speed=SpeedConfig(device="cpu", compile="off", precision="fp32", channels_last="on"),
        run=replace(base.run, epochs=epochs, batch_size=32, eval_every=epochs, progress=False, out_dir=str(tmp_path)),
    )


def test_the_stem_bias_stops_needing_a_gradient_after_its_epochs_and_training_is_unchanged(tmp_path):
    """5 epochs, the bias held from epoch 4: against the same run that only holds its lr at 0 (the
    behaviour before), bit for bit; the bias does not move once frozen, and trains again in epoch 1."""
    cfg = _record(tmp_path, epochs=5)
    assert cfg.optim.whiten_bias_epochs == 3
    info = DistInfo(0, 0, 1, CPU)
    frozen = Trainer(cfg, info, log=lambda *a, **k: None)
    held = Trainer(cfg, info, bundle=frozen.bundle, log=lambda *a, **k: None)
    held.frozen_bias = None  # lr 0 only: the gradient still computed
    bias = frozen.raw_model.stem.bias
    assert frozen.frozen_bias is bias
    for epoch in range(1, 6):
        for tr in (frozen, held):
            tr.train_epoch(epoch)
        assert bias.requires_grad == (epoch <= 3) and held.raw_model.stem.bias.requires_grad
        if epoch == 3:
            at_freeze = bias.detach().clone()
    assert torch.equal(bias, at_freeze) and bias.abs().sum() > 0  # it trained, then stood still
    a, b = frozen.raw_model.state_dict(), held.raw_model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert frozen.evaluate() == held.evaluate()
    frozen.begin_epoch(1)  # a new run of epochs (or a resumed one) sets it per epoch
    assert bias.requires_grad


def test_the_bias_is_frozen_only_where_its_epochs_end_inside_the_run_and_one_process_trains():
    model = build_model("fastnet", 3, 10, 32)
    optim = get_preset("cifar10-record").optim  # whiten_bias_epochs = 3
    assert bias_to_freeze(model, optim, 8, distributed=False) is model.stem.bias
    assert bias_to_freeze(model, optim, 3, distributed=False) is None  # never stops inside the run
    assert bias_to_freeze(model, optim, 8, distributed=True) is None  # DDP fixed what sends gradients
    assert bias_to_freeze(model, replace(optim, whiten_bias_epochs=0), 8, distributed=False) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_warm_up_captures_a_graph_for_each_set_of_trainable_parameters(tmp_path):
    """Both graphs captured outside the timed epochs; epochs 1-3 replay the first, 4-5 the second,
    whose backward leaves the bias alone (no gradient, not moved) while the rest trains on, and the
    losses follow an eager run's."""
    cfg = get_preset("cifar10-record")
    cfg = replace(
        cfg,
        data=DataConfig(source="synthetic", image_shape="3x32x32", synthetic_samples=640, resident="on"),
        model=ModelConfig(name="fastnet"),
        speed=replace(cfg.speed, compile="off", cuda_graphs="on", precision="fp32"),
        run=RunConfig(epochs=5, batch_size=128, progress=False, out_dir=str(tmp_path)),
    )
    info = DistInfo(0, 0, 1, torch.device("cuda", 0))
    tr = Trainer(cfg, info, log=lambda *a, **k: None)
    eager = Trainer(replace(cfg, speed=replace(cfg.speed, cuda_graphs="off")), info, log=lambda *a, **k: None)
    assert tr.use_graphs and not eager.use_graphs
    tr.warm_up_compile()
    graphs = dict(tr.train_step.graphs)
    assert len(graphs) == 2 and {shape for shape, _ in graphs} == {(128, 3, 32, 32)}
    bias, head = tr.raw_model.stem.bias, tr.raw_model.head.weight
    for epoch in range(1, 6):
        got, want = tr.train_epoch(epoch), eager.train_epoch(epoch)
        assert (bias.grad is None) == (epoch > 3)
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=0.05)
        if epoch == 3:
            bias_then, head_then = bias.detach().clone(), head.detach().clone()
    assert tr.train_step.graphs == graphs  # replayed, not captured again
    assert torch.equal(bias, bias_then) and not torch.equal(head, head_then)


def test_the_resident_loader_draws_the_next_epochs_indices_ahead_and_yields_the_samplers_batches(monkeypatch):
    import threading

    from torch.utils.data import DistributedSampler

    import cnnpar.data.loader as loader_mod
    from cnnpar.data.bundle import ArrayDataset
    from cnnpar.data.loader import ResidentLoader

    in_loop = []  # epochs whose indices the iterating thread drew itself

    def counted(sampler):
        if threading.current_thread() is threading.main_thread():
            in_loop.append(sampler.epoch)
        return loader_mod.epoch_indices.__wrapped__(sampler)

    counted.__wrapped__ = loader_mod.epoch_indices
    monkeypatch.setattr(loader_mod, "epoch_indices", counted)

    n = 103
    ds = ArrayDataset(torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1), torch.arange(n))
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=7)
    loader = ResidentLoader(ds, sampler, 10, True, CPU)
    for epoch in (1, 2, 3, 3, 7, 8):  # in order, the same epoch twice, a jump (a resumed run)
        sampler.set_epoch(epoch)
        want = list(sampler)
        got = [y.tolist() for _, y in loader]
        assert got == [want[i : i + 10] for i in range(0, 100, 10)], epoch
        assert loader._ahead is not None and loader._ahead[0] == epoch + 1  # drawn meanwhile
    assert in_loop == [1, 3, 7]  # the first, the repeat and the jump; 2, 3 and 8 were drawn ahead


def test_orthogonalize_many_pads_each_matrix_without_changing_its_iteration():
    from cnnpar.engine.muon import orthogonalize, orthogonalize_many, pad_buckets

    g = torch.Generator().manual_seed(0)
    mats = [torch.randn(s, generator=g) for s in ((64, 216), (256, 576), (40, 3), (8, 8))]
    for got, m in zip(orthogonalize_many(mats, 3), mats):
        assert got.shape == m.shape and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), orthogonalize(m, 3).float(), atol=2e-2, rtol=0)  # bf16 steps
    fastnet = [(64, 216), (64, 576), (256, 576), (256, 2304), (256, 2304), (256, 2304)]
    assert pad_buckets(fastnet) == [[3, 4, 5, 2, 1, 0]]  # one batch, the largest first
    assert pad_buckets([(64, 27), (2048, 4608), (2048, 4608)]) == [[1, 2], [0]]  # no tiny one padded huge


def test_the_batched_step_on_fastnets_filters_matches_torch_muon():
    """cifar10-record's Muon group (normalised filters, momentum 0.6, 3 iterations) over three
    steps, fastnet's six channels_last filters in one padded batch, against torch.optim.Muon."""
    from cnnpar.engine.muon import MuonSGD, torch_muon_available

    if not torch_muon_available():
        pytest.skip("this torch has no torch.optim.Muon")

    def build(use_torch):
        torch.manual_seed(0)
        model = build_model("fastnet", 3, 10, 32).to(memory_format=torch.channels_last)
        filters = [p for n, p in model.named_parameters() if p.ndim == 4 and n != "stem.weight"]
        group = {"params": filters, "muon": True, "lr": 0.24, "momentum": 0.6, "ns_steps": 3, "normalize": True}
        return filters, MuonSGD([group], use_torch_muon=use_torch)

    (mine, batched), (theirs, reference) = build(False), build(True)
    assert len(mine) == 6
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        for a, b in zip(mine, theirs):
            grad = torch.randn(a.shape, generator=g).contiguous(memory_format=torch.channels_last)
            a.grad, b.grad = grad.clone(), grad.clone()
        batched.step()
        reference.step()
    assert len(batched._buckets) == 1 and len(next(iter(batched._buckets.values()))) == 1  # one batch
    for a, b in zip(mine, theirs):
        assert a.stride() == b.stride()
        torch.testing.assert_close(a, b, atol=2e-3, rtol=0)
