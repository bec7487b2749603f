"""A stride-2 convolution on a few input channels, computed as the same function on 2x2 blocks.

ResNet's stem is a 7x7 stride-2 convolution on 3 channels. On an H200 cuDNN pads the 3 channels to 8
(`nhwcAddPaddingKernel`) and runs an SM80-style CUTLASS kernel for it: 1.54 ms forward and ~0.88 ms for the
weight gradient of a 36.7 ms ResNet-50 step at batch 256 (benchmarks/results/2026-12-01-h200/call-zk, the
trace). Space to depth rewrites it exactly: with x padded as the convolution pads it,

    y[i, j] = sum over (kh, kw) of W[kh, kw] x[2i + kh, 2j + kw],   kh = 2u + a, kw = 2v + b (a, b in {0, 1})
            = sum over (u, v) of W'[u, v] z[i + u, j + v],          z[a, b][p, q] = x[2p + a, 2q + b]

so the stem becomes a ceil(k/2) x ceil(k/2) stride-1 convolution on the 2x2 blocks of the input
(`pixel_unshuffle`: 3 channels -> 12), zero-padded to a multiple of 8 channels so that every 16-byte row of
bf16 is aligned. The weight stays the module's own k x k parameter (state_dict, checkpoints and
`cnnpar predict` unchanged); the rearranged weight is made from it at each call (9,408 numbers for ResNet's
stem), so its gradient flows back to the parameter. The same function, summed in another order: equal to the
plain convolution to rounding.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

MAX_IN_CHANNELS = 4  # only few-channel convolutions map badly onto tensor-core kernels
MIN_KERNEL = 5  # a 3x3 stride-2 convolution would become 2x2 on 4x the channels: not the case measured
ALIGN = 8  # input channels as a multiple of 8: 16-byte rows of bf16


def _blocked_weight(weight: torch.Tensor, channels: int) -> torch.Tensor:
    """(out, c, k, k) -> (out, channels, kb, kb): tap (2u + a, 2v + b) of input channel c goes to input channel
    4c + 2a + b (pixel_unshuffle's order) at (u, v); taps past k and channels past 4c are zero."""
    out, c, k, _ = weight.shape
    kb = (k + 1) // 2
    w = F.pad(weight, (0, 2 * kb - k, 0, 2 * kb - k))  # (out, c, 2kb, 2kb)
    w = w.reshape(out, c, kb, 2, kb, 2).permute(0, 1, 3, 5, 2, 4).reshape(out, 4 * c, kb, kb)
    return F.pad(w, (0, 0, 0, 0, 0, channels - 4 * c))


class SpaceToDepthConv2d(nn.Conv2d):
    """An nn.Conv2d (stride 2, square kernel, zero padding, no dilation or groups) that convolves 2x2 blocks."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, p = self.kernel_size[0], self.padding[0]
        kb = (k + 1) // 2
        h, w = x.shape[-2:]
        out_h, out_w = (h + 2 * p - k) // 2 + 1, (w + 2 * p - k) // 2 + 1
        # padded to exactly 2 * (out + kb - 1) rows and columns (a negative pad crops rows no tap reads)
        x = F.pad(x, (p, 2 * (out_w + kb - 1) - w - p, p, 2 * (out_h + kb - 1) - h - p))
        channels = -(-4 * self.in_channels // ALIGN) * ALIGN
        z = F.pixel_unshuffle(x, 2)
        z = F.pad(z, (0, 0, 0, 0, 0, channels - z.shape[1]))
        return F.conv2d(z, _blocked_weight(self.weight, channels), self.bias)


def fits(conv: nn.Module) -> bool:
    """Whether `conv` is a convolution this rewrite covers and is meant for."""
    return (
        type(conv) is nn.Conv2d
        and conv.stride == (2, 2)
        and conv.dilation == (1, 1)
        and conv.groups == 1
        and conv.padding_mode == "zeros"
        and isinstance(conv.padding, tuple)
        and conv.padding[0] == conv.padding[1]
        and conv.kernel_size[0] == conv.kernel_size[1] >= MIN_KERNEL
        and conv.in_channels <= MAX_IN_CHANNELS
    )


def has_stem_to_rewrite(model: nn.Module) -> bool:
    """Whether --stem-space-to-depth changes `model` (a convolution it rewrites, or has rewritten)."""
    return any(isinstance(m, SpaceToDepthConv2d) or fits(m) for m in model.modules())


def stem_line(blocked: list[str], requested: str) -> str:
    """The run's line about the stem, once the switch resolved on: what was swapped and why; where nothing was,
    a line only if the user asked for it (auto says nothing for a small CNN or a 3x3 small-image stem)."""
    why = "auto: on with CUDA" if requested == "auto" else "as asked"
    if blocked:
        return f"stem: {', '.join(blocked)} computed on 2x2 blocks of its input (--stem-space-to-depth; {why})"
    if requested == "auto":
        return ""
    return (
        "stem: --stem-space-to-depth changes nothing here (no stride-2 convolution of 5x5 or more on at most 4 "
        "channels)"
    )


def space_to_depth_stem(model: nn.Module) -> list[str]:
    """Swap every fitting convolution of `model` for a SpaceToDepthConv2d holding the same parameters (the
    same Parameter objects: an optimizer or EMA built afterwards sees them). Returns the swapped names."""
    swapped = []
    for name, module in list(model.named_modules()):
        if not fits(module):
            continue
        new = SpaceToDepthConv2d(
            module.in_channels,
            module.out_channels,
            module.kernel_size,
            stride=2,
            padding=module.padding,
            bias=module.bias is not None,
            device="meta",  # its own weights are never made: the old module's Parameters move over
        )
        new.weight = module.weight
        new.bias = module.bias
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
        swapped.append(name)
    return swapped
