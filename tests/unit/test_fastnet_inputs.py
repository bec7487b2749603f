"""fastnet on the inputs it was not written for: images smaller than its layers take (refused in one line before a
run folder, as cnn3's), and non-RGB data for its whitened stem (every eigenvector pair the patches have, the bias
zeroed, --whiten-frozen refused where frozen filters would be random), RGB bit for bit as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cnnpar.config import OptimConfig
from cnnpar.engine.optim import apply_frozen_whitening
from cnnpar.errors import ConfigError
from cnnpar.models import build_model, fastnet

pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the smallest input ------------------------------------------------------------------------
def test_the_smallest_side_comes_from_the_layers_and_trains_one_below_is_refused():
    """2x2 unpadded stem (side - 1), then three 2x2 max-pools: 9 -> 8 -> 4 -> 2 -> 1; 8 -> 7 -> 3 -> 1 -> 0."""
    for h, w in ((9, 9), (9, 16), (16, 9)):  # the global max pool takes any shape: height and width each
        torch.manual_seed(0)
        model = build_model("fastnet", 1, 3, h, w)
        x = torch.randn(4, 1, h, w)
        model.init_from_data(x)
        F.cross_entropy(model(x), torch.tensor([0, 1, 2, 0])).backward()
        assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters() if p.requires_grad)
    with pytest.raises(ConfigError) as e:
        build_model("fastnet", 1, 10, 8)
    assert str(e.value) == (
        "model fastnet: input images 8x8: expected at least 9x9 (its 2x2 stem, then a 2x2 max-pool in each of its "
        "3 stages); give --image-size 9 or more"
    )
    assert fastnet.MIN_SIDE == 9 and fastnet.final_side(9) == 1 and fastnet.final_side(8) == 0
    for h, w in ((8, 16), (16, 8)):
        with pytest.raises(ConfigError, match=rf"^model fastnet: input images {h}x{w} \(HxW\): expected at least 9x9"):
            build_model("fastnet", 3, 10, h, w)


def test_train_refuses_a_too_small_image_in_one_line_before_a_run_folder_and_trains_the_smallest(tmp_path, capsys):
    """--image-size 8 failed mid-epoch (a max pool's `Output size is too small`) and left a run folder."""
    from cnnpar.cli import main

    runs = tmp_path / "runs"
    args = ["train", "--model", "fastnet", "--epochs", "1", "--out-dir", str(runs), "--no-progress"]
    args += ["--no-tensorboard", "--device", "cpu"]
    assert main([*args, "--image-size", "8"]) == 2 and not runs.exists()
    err = capsys.readouterr().err
    assert (
        err.startswith("cnnpar: error: model fastnet: input images 8x8: expected at least 9x9") and err.count("\n") == 1
    )
    assert "--image-size 9 or more" in err
    assert main([*args, "--image-size", "9", "--max-steps", "1"]) == 0
    assert len(list(runs.glob("*/ckpt/last.pt"))) == 1


# ---- the whitened stem -------------------------------------------------------------------------
def _before(model, x: torch.Tensor, eps: float = 5e-4) -> None:
    """FastNet.init_from_data as it was (e.g. at 6e5e9ec), verbatim: the reference RGB must still match."""
    c, k = model.stem.in_channels, model.stem.kernel_size[0]
    patches = x.float().unfold(2, k, 1).unfold(3, k, 1)
    patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * k * k).double()
    patches = patches - patches.mean(dim=0)
    cov = patches.T @ patches / len(patches)
    eigval, eigvec = torch.linalg.eigh(cov)
    filters = (eigvec.T / torch.sqrt(eigval.clamp_min(0) + eps)[:, None]).float().view(-1, c, k, k)
    n = filters.shape[0]
    if model.stem.out_channels >= 2 * n:
        w = torch.cat([filters, -filters])
        model.stem.weight[: 2 * n].copy_(w)
        model.stem.bias.zero_()


def _data(channels: int, seed: int = 1) -> torch.Tensor:
    x = torch.randn(64, channels, 12, 12, generator=torch.Generator().manual_seed(seed))
    return x + 0.5 * x.roll(1, dims=1) + 0.3 * x.roll(1, dims=3)  # channels and neighbours correlated


@pytest.mark.parametrize("channels", [3, 1])
def test_the_rgb_stem_is_whitened_bit_for_bit_as_before(channels):
    """The CIFAR record relies on the RGB stem: the same weights and bias, to the bit (grey kept its 8 too)."""
    x = _data(channels)
    torch.manual_seed(0)
    model, ref = build_model("fastnet", channels, 10, 32), build_model("fastnet", channels, 10, 32)
    ref.load_state_dict(model.state_dict())
    model.init_from_data(x)
    with torch.no_grad():
        _before(ref, x)
    assert torch.equal(model.stem.weight, ref.stem.weight) and torch.equal(model.stem.bias, ref.stem.bias)


@pytest.mark.parametrize("channels,whitened", [(1, 8), (2, 16), (3, 24), (4, 24)])
def test_the_stem_takes_every_eigenvector_pair_it_has_room_for_and_zeroes_the_bias(channels, whitened):
    """Before, 4 channels (16 eigenvectors, 32 filters wanted of 24) whitened none and kept the random bias."""
    x = _data(channels)
    torch.manual_seed(0)
    model = build_model("fastnet", channels, 10, 32)
    init = model.stem.weight.detach().clone()
    model.init_from_data(x)
    w, n = model.stem.weight.detach(), whitened // 2
    assert torch.equal(model.stem.bias, torch.zeros(24))
    assert torch.equal(w[n:whitened], -w[:n])  # +/- pairs
    assert torch.equal(w[whitened:], init[whitened:])  # no eigenvector left for these: their random init
    k = model.stem.kernel_size[0]
    patches = x.unfold(2, k, 1).unfold(3, k, 1).permute(0, 2, 3, 1, 4, 5).reshape(-1, channels * k * k)
    feats = patches @ w[:n].reshape(n, -1).T
    cov = torch.cov(feats.T)
    assert (cov - torch.diag(torch.diag(cov))).abs().max() < 0.02  # decorrelated, each of variance ~1
    assert torch.allclose(torch.diag(cov), torch.ones(n), atol=0.05)
    if channels == 4:  # 12 of 16 eigenvectors: those of largest variance (the others' directions left out)
        eigval, eigvec = torch.linalg.eigh(torch.cov(patches.T.double()))
        left_out = (patches @ eigvec[:, :4].float()).var(0)
        kept = (patches @ eigvec[:, 4:].float()).var(0)
        assert left_out.max() <= kept.min()
        overlap = w[:n].reshape(n, -1).double() @ eigvec[:, :4]  # no filter reads a left-out direction
        assert overlap.abs().max() < 1e-3 * w[:n].abs().max()
    assert model.whitened_filters() == whitened  # what --whiten-frozen checks


@pytest.mark.parametrize("channels", [1, 2])
def test_frozen_whitening_is_refused_where_filters_would_stay_random(channels):
    model = build_model("fastnet", channels, 10, 32)
    with pytest.raises(ConfigError) as e:
        apply_frozen_whitening(model, OptimConfig(whiten_frozen=True))
    random = 24 - 8 * channels
    assert str(e.value) == (
        f"optim.whiten_frozen (--whiten-frozen): FastNet's stem on {channels}-channel images is whitened in "
        f"{8 * channels} of its 24 filters (its {4 * channels} patch eigenvectors, +/-); the other {random} "
        "would stay random, frozen for the whole run: expected --no-whiten-frozen"
    )
    assert model.stem.weight.requires_grad
    apply_frozen_whitening(model, OptimConfig(whiten_frozen=False, whiten_bias_epochs=2))  # trainable: fine
    for full in (3, 4):
        model = build_model("fastnet", full, 10, 32)
        apply_frozen_whitening(model, OptimConfig(whiten_frozen=True))
        assert not model.stem.weight.requires_grad


def test_train_refuses_frozen_random_stem_filters_in_one_line_before_a_run_folder(tmp_path, capsys):
    from cnnpar.cli import main

    runs = tmp_path / "runs"
    args = ["train", "--model", "fastnet", "--whiten-frozen", "--out-dir", str(runs), "--no-progress"]
    assert main([*args, "--no-tensorboard", "--device", "cpu"]) == 2 and not runs.exists()  # grey digits
    err = capsys.readouterr().err
    assert (
        err.startswith("cnnpar: error: optim.whiten_frozen (--whiten-frozen): FastNet's stem on 1-channel images")
        and err.count("\n") == 1
    )
