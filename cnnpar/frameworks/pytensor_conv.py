"""A PyTensor graph rewrite that lowers `pytensor.tensor.conv.conv2d` to im2col + GEMM.

Why: PyTensor 2.30 keeps Theano's abstract convolution ops (`AbstractConv2d` and its two gradient
ops) but dropped Theano's compiled implementations of them (CorrMM, cuDNN). What is left is the
pure-Python reference `perform`, a scipy `_convolve2d` call per (image, output channel, input
channel): hundreds of thousands of calls per batch for cnn3, hours per MNIST epoch. Theano itself
never ran that path in practice: its optimizer replaced the abstract ops by CorrMM, an im2col +
GEMM implementation. This module does the same replacement, written in PyTensor's own tensor ops
(slices, reshapes, one `dot` per op), so the C linker compiles it and BLAS does the arithmetic.

Covered: 2-D, stride 1, no dilation, one group, shared weights, kernel shape known at graph-build
time, border modes "valid", "half" and symmetric integer padding. Anything else is left to the
reference implementation (slow, but correct).
"""

from __future__ import annotations

import pytensor.tensor as pt
from pytensor.compile import optdb
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.tensor.conv.abstract_conv import (
    AbstractConv2d,
    AbstractConv2d_gradInputs,
    AbstractConv2d_gradWeights,
)

REWRITE_NAME = "cnnpar_conv2d_im2col"


def _pad_amount(border_mode, kh: int, kw: int) -> tuple[int, int] | None:
    if border_mode == "valid":
        return 0, 0
    if border_mode == "half":
        return kh // 2, kw // 2
    if isinstance(border_mode, tuple) and all(isinstance(b, int) for b in border_mode):
        return border_mode[0], border_mode[1]
    return None  # "full" and asymmetric pads: not lowered


def _pad(x, ph: int, pw: int):
    if ph == 0 and pw == 0:
        return x
    b, c, h, w = x.shape
    out = pt.zeros((b, c, h + 2 * ph, w + 2 * pw), dtype=x.dtype)
    return pt.set_subtensor(out[:, :, ph : ph + h, pw : pw + w], x)


def _columns(x_pad, kh: int, kw: int, oh, ow):
    """(B, C, H+2p, W+2p) -> (C*kh*kw, B*oh*ow): every kernel tap as one row block."""
    taps = [x_pad[:, :, i : i + oh, j : j + ow] for i in range(kh) for j in range(kw)]
    cols = pt.stack(taps, axis=2)  # B, C, kh*kw, oh, ow
    b, c = x_pad.shape[0], x_pad.shape[1]
    return cols.dimshuffle(1, 2, 0, 3, 4).reshape((c * kh * kw, b * oh * ow))


def correlate(img, kern, kh: int, kw: int, ph: int, pw: int):
    """Cross-correlation (PyTorch's conv2d), stride 1: (B, C, H, W) x (O, C, kh, kw) -> (B, O, oh, ow)."""
    b, h, w = img.shape[0], img.shape[2], img.shape[3]
    oh, ow = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    cols = _columns(_pad(img, ph, pw), kh, kw, oh, ow)
    out = pt.dot(kern.reshape((kern.shape[0], -1)), cols)  # O, B*oh*ow
    return out.reshape((kern.shape[0], b, oh, ow)).dimshuffle(1, 0, 2, 3)


def _static_kernel_shape(op, var) -> tuple[int, int] | None:
    kshp = getattr(op, "kshp", None)
    if kshp is not None and len(kshp) == 4 and all(isinstance(s, int) for s in kshp[2:]):
        return int(kshp[2]), int(kshp[3])
    shape = var.type.shape if var is not None else None
    if shape is not None and len(shape) == 4 and shape[2] is not None and shape[3] is not None:
        return int(shape[2]), int(shape[3])
    return None


def _lowerable(op) -> bool:
    return (
        op.convdim == 2
        and tuple(op.subsample) == (1, 1)
        and tuple(op.filter_dilation) == (1, 1)
        and op.num_groups == 1
        and not op.unshared
    )


def _flip(kern):
    return kern[:, :, ::-1, ::-1]


@node_rewriter([AbstractConv2d, AbstractConv2d_gradWeights, AbstractConv2d_gradInputs])
def lower_conv2d_to_im2col(fgraph, node):
    op = node.op
    if not _lowerable(op):
        return None
    if isinstance(op, AbstractConv2d):
        img, kern = node.inputs
        kshape = _static_kernel_shape(op, kern)
        if kshape is None:
            return None
        pads = _pad_amount(op.border_mode, *kshape)
        if pads is None:
            return None
        k = _flip(kern) if op.filter_flip else kern
        return [correlate(img, k, *kshape, *pads).astype(node.outputs[0].dtype)]
    if isinstance(op, AbstractConv2d_gradWeights):
        img, topgrad, _shape = node.inputs
        kshape = _static_kernel_shape(op, None)
        if kshape is None:
            return None
        pads = _pad_amount(op.border_mode, *kshape)
        if pads is None:
            return None
        kh, kw = kshape
        oh, ow = topgrad.shape[2], topgrad.shape[3]
        cols = _columns(_pad(img, *pads), kh, kw, oh, ow)  # C*kh*kw, B*oh*ow
        o = topgrad.shape[1]
        g = topgrad.dimshuffle(1, 0, 2, 3).reshape((o, -1))  # O, B*oh*ow
        gk = pt.dot(g, cols.T).reshape((o, img.shape[1], kh, kw))
        return [(_flip(gk) if op.filter_flip else gk).astype(node.outputs[0].dtype)]
    # AbstractConv2d_gradInputs: a correlation of the output gradient with the kernel turned
    # around (spatially flipped, in/out channels swapped), padded by k - 1 - p.
    kern, topgrad, _shape = node.inputs
    kshape = _static_kernel_shape(op, kern)
    if kshape is None:
        return None
    pads = _pad_amount(op.border_mode, *kshape)
    if pads is None:
        return None
    kh, kw = kshape
    k = kern if op.filter_flip else _flip(kern)
    k = k.dimshuffle(1, 0, 2, 3)
    return [correlate(topgrad, k, kh, kw, kh - 1 - pads[0], kw - 1 - pads[1]).astype(node.outputs[0].dtype)]


def register() -> None:
    """Put the lowering before canonicalisation, so the usual passes then optimise its output."""
    if REWRITE_NAME not in optdb.__db__:
        optdb.register(REWRITE_NAME, in2out(lower_conv2d_to_im2col), "fast_run", "fast_compile", position=0.5)
