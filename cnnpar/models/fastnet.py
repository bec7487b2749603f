"""fastnet: a small, fast net for 32x32 images.

Three stages, each a conv that widens, a 2x2 max pool, BN and GELU, then a second conv at the
same width; a global max pool and one linear layer. No residuals, few layers, wide channels:
on a GPU its cost is a handful of large convolutions rather than many small launches, which is
what makes the fastest published CIFAR-10 trainers fast. The logits are scaled down so the
untrained net starts near uniform predictions.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from cnnpar.models.registry import register

WIDTHS = (64, 256, 256)
STEM = 24
STEM_KERNEL = 2  # unpadded, stride 1: the patches whose covariance the stem whitens
LOGIT_SCALE = 1 / 9


def final_side(side: int) -> int:
    """The side of the last stage's maps for an input side: the stem takes STEM_KERNEL - 1 off (no padding), then
    each stage's 2x2 max pool halves it, rounding down (its 3x3 convs are padded: they keep it)."""
    side -= STEM_KERNEL - 1
    for _ in WIDTHS:
        side //= 2
    return side


def min_side() -> int:
    """The smallest input side (height, and width) whose last maps are at least 1x1: 9 for a 2x2 stem and three
    pools. Below it a pool's output is empty and the first training step fails mid-epoch."""
    side = STEM_KERNEL
    while final_side(side) < 1:
        side += 1
    return side


MIN_SIDE = min_side()


def _bn(c: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c, momentum=0.4, eps=1e-12)
    bn.weight.requires_grad_(False)  # a fixed scale of one: the next conv's weights carry it
    return bn


class ConvStage(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.bn1 = _bn(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = _bn(c_out)
        self.act = nn.GELU()

    def forward(self, x):
        x = self.act(self.bn1(self.pool(self.conv1(x))))
        return self.act(self.bn2(self.conv2(x)))


class FastNet(nn.Module):
    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, STEM, STEM_KERNEL, padding=0, bias=True)
        self.stem_act = nn.GELU()
        chans = (STEM, *WIDTHS)
        self.stages = nn.Sequential(*(ConvStage(a, b) for a, b in zip(chans[:-1], chans[1:])))
        self.head = nn.Linear(WIDTHS[-1], num_classes, bias=False)
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m is not self.stem:
                # start each conv close to identity on the channels it keeps
                nn.init.dirac_(m.weight[: m.in_channels])
                if m.out_channels > m.in_channels:
                    nn.init.kaiming_normal_(m.weight[m.in_channels :], nonlinearity="relu")

    def whitened_filters(self) -> int:
        """How many of the stem's filters `init_from_data` sets from the data: two (+/-) for each eigenvector of the
        c x k x k patch covariance, as many pairs as fit: 24 of 24 for RGB (12 eigenvectors), 8 for grey (4: the
        other 16 keep their random init), 24 for 4 channels (the 12 of 16 eigenvectors of largest variance)."""
        c, k = self.stem.in_channels, self.stem.kernel_size[0]
        return 2 * min(c * k * k, self.stem.out_channels // 2)

    @torch.no_grad()
    def init_from_data(self, x: torch.Tensor, eps: float = 5e-4) -> None:
        """Whiten the stem: its filters become the eigenvectors of the 2x2 patch covariance of
        the training images, scaled by 1/sqrt(eigenvalue), in +/- pairs. The first layer then
        starts out decorrelating its input instead of learning to, which shortens training.

        Where there are more eigenvectors than pairs of filters (more than 3 channels) the pairs go to those of
        largest variance; where fewer (1 or 2 channels), the filters after the pairs keep their random init
        (`whitened_filters` says how many are set). The whole bias starts at zero either way."""
        c, k = self.stem.in_channels, self.stem.kernel_size[0]
        patches = x.float().unfold(2, k, 1).unfold(3, k, 1)  # N, C, H', W', k, k
        # float64: on a GPU float32 products may run as TF32 (bf16 runs turn it on), whose 10-bit
        # mantissa would blur the small eigenvalues the whitening divides by
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * k * k).double()
        patches = patches - patches.mean(dim=0)
        cov = patches.T @ patches / len(patches)
        eigval, eigvec = torch.linalg.eigh(cov)
        filters = (eigvec.T / torch.sqrt(eigval.clamp_min(0) + eps)[:, None]).float().view(-1, c, k, k)
        n = self.whitened_filters() // 2
        filters = filters[len(filters) - n :]  # eigh's eigenvalues ascend: the n of largest variance, in that order
        self.stem.weight[: 2 * n].copy_(torch.cat([filters, -filters]))
        self.stem.bias.zero_()

    def whitening_params(self) -> tuple[nn.Parameter, nn.Parameter]:
        """(filters, bias) of the data-whitened stem, for the optimizer's whitening switches."""
        return self.stem.weight, self.stem.bias

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """Logits from the last stage's maps: the largest value of each map, then the head.

        The max pool is max_pool2d with the window the size of the map (3x3 for 32x32 inputs, as
        airbench's MaxPool2d(3)), whose backward sends the gradient to the index the forward
        picked. Not torch.amax: its backward finds the maximum again by comparing the input with
        the output, and under torch.compile with bf16 autocast Inductor keeps a fused kernel's
        intermediates in fp32 without rounding them to bf16 (emulate_precision_casts is off), so
        the recomputed input need not equal the stored bf16 maximum: no element matched, and every
        gradient became 0/0 = NaN from the first step on. Not adaptive_max_pool2d either: the same
        values and gradients, but Inductor runs its backward as a fallback kernel of its own (it
        lowers max_pool2d's into the fused code), and on an H200 the record preset trained 1.41 s
        with it against 1.36 s with amax (benchmarks/results/2026-12-01-h200, calls D and A)."""
        return self.head(F.max_pool2d(x, x.shape[-2:]).flatten(1)) * LOGIT_SCALE

    def forward(self, x):
        return self.classify(self.stages(self.stem_act(self.stem(x))))


@register(
    "fastnet",
    "small wide net for 32x32 images (3 conv stages, no residuals); fast on GPUs",
    min_side=(
        MIN_SIDE,
        f"its {STEM_KERNEL}x{STEM_KERNEL} stem, then a 2x2 max-pool in each of its {len(WIDTHS)} stages",
    ),
)
def build_fastnet(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return FastNet(in_channels, num_classes)
