"""Muon for convolution filters and SGD with Nesterov momentum for the rest, as one optimizer.

Muon (Keller Jordan, 2024) replaces a weight matrix's momentum-averaged gradient by a nearby
semi-orthogonal matrix (singular values near one), found with a few Newton-Schulz iterations, so
every direction the layer can move in moves by about as much. A filter bank of shape (out, in, kh,
kw) is the (out, in * kh * kw) matrix it multiplies image patches with, and Muon sees it so.

A channels_last filter is viewed with its columns ordered (kh, kw, in) instead of (in, kh, kw):
orthogonalisation commutes with a permutation of columns, so the update is the same.

By default the step is torch.optim.Muon's arithmetic (the same coefficients, momentum rule, lr
adjustment and bf16 iteration; fp32 on a CPU that emulates bf16, `ns_dtype`) run on all of a group's
filters at once: `orthogonalize_many` pads each matrix with zeros to one shape and iterates on the
batch, which is exact (zero rows and columns stay zero and change no product of the others) and
turns 6 filters x 13 small kernels into 13 batched ones; the momentum is one multi-tensor lerp.
torch.optim.Muon (torch 2.9 and later) runs each parameter on its own, about 17 kernel launches per
filter per step: on the record preset's 200 steps of a few milliseconds each those launches are GPU
time. `use_torch_muon=True` still hands torch.optim.Muon 2-D views of the filters (the same storage:
its in-place update moves them), as the reference the tests compare with.

airbench94_muon also rescales each filter bank to Frobenius norm sqrt(out) before every step
(`normalize`). Its filters all feed BatchNorm, so only their direction matters; a fixed norm keeps
the step a fixed angle instead of one that shrinks as the weights grow, and replaces weight decay.

Why one optimizer object: the trainer, its lr schedule (one LambdaLR scales every group), the fp16
GradScaler and checkpoints all expect one. A Muon group is an ordinary param group marked
`muon=True`; every other group takes torch's own SGD (`torch.optim.sgd.sgd`, fused on CUDA).
"""

from __future__ import annotations

import functools
import math

import torch
from torch.optim.sgd import sgd

from cnnpar.parallel.precision import cpu_has_native_bf16

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic, as torch.optim.Muon uses
EPS = 1e-7


def torch_muon_available() -> bool:
    return hasattr(torch.optim, "Muon")


def ns_dtype(device: torch.device) -> torch.dtype:
    """The dtype the Newton-Schulz iteration runs in on `device`: bf16, as torch.optim.Muon's, on GPUs and on CPUs
    that multiply bf16 in hardware; fp32 on other CPUs, where oneDNN emulates bf16 products. On a 2-core EPYC
    without it, one iteration on fastnet's six filters (padded to 6 x 256 x 2304) took 1.51 s in bf16 and 0.02 s in
    fp32: 99 % of a step of the cifar10-record preset. fp32 is the more exact of the two."""
    return torch.float32 if device.type == "cpu" and not _cpu_bf16() else torch.bfloat16


@functools.cache
def _cpu_bf16() -> bool:
    return cpu_has_native_bf16()


def orthogonalize(
    g: torch.Tensor, steps: int, coefficients=NS_COEFFICIENTS, eps: float = EPS, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Newton-Schulz iteration towards the orthogonal factor of the 2-D `g`, in `dtype` (bf16): the same
    operations, in the same order, as torch.optim.Muon's (so the two agree where both exist). It
    stops short of converging on purpose: singular values end spread around one, which trains as
    well as the exact factor at a fraction of the cost."""
    if g.ndim != 2:
        raise ValueError(f"orthogonalize: expected a 2-D matrix, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1: inside the iteration's basin
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def orthogonalize_many(
    gs: list[torch.Tensor], steps: int, coefficients=NS_COEFFICIENTS, eps: float = EPS, dtype=torch.bfloat16
):
    """`orthogonalize` of every 2-D matrix in `gs`, as one batch: each (transposed when tall, as
    there) is copied into a zero `dtype` (bf16) block of the largest rows and columns among them. The padding
    changes nothing: the Frobenius norm is the same, X X^T gains zero rows and columns only, and
    every product keeps them zero, so each block iterates as it would alone (up to the order bf16
    sums run in). Returns `dtype` views of the batch, shaped like `gs`."""
    a, b, c = coefficients
    wide = [g.T if g.size(0) > g.size(1) else g for g in gs]
    rows, cols = max(w.size(0) for w in wide), max(w.size(1) for w in wide)
    x = torch.zeros(len(gs), rows, cols, dtype=dtype, device=gs[0].device)
    for block, w in zip(x, wide):
        block[: w.size(0), : w.size(1)].copy_(w)  # rounds to bf16 as g.bfloat16() does
    x = x / torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    out = []
    for block, g, w in zip(x, gs, wide):
        o = block[: w.size(0), : w.size(1)]
        out.append(o.T if w is not g else o)
    return out


PAD_FREE = 1 << 22  # padded elements below which a batch is taken as launch-bound (not measured)


def pad_buckets(shapes: list[tuple[int, int]]) -> list[list[int]]:
    """Indices of `shapes` (2-D, rows and columns) grouped for `orthogonalize_many`: largest first,
    a matrix joins the current group while the group's padded size stays under PAD_FREE elements or
    within 1.25x its matrices' own. Small iterations cost launches rather than arithmetic (fastnet's
    six filters padded to 6 x 256 x 2304: 1.8 GFLOP per product, microseconds on an H200), while
    padding a 64x27 matrix into a group of 2048x4608 ones would add arithmetic that counts."""
    wide = [(min(r, c), max(r, c)) for r, c in shapes]
    order = sorted(range(len(shapes)), key=lambda i: wide[i][0] * wide[i][1], reverse=True)
    groups: list[list[int]] = []
    for i in order:
        if groups:
            g = groups[-1] + [i]
            padded = len(g) * max(wide[j][0] for j in g) * max(wide[j][1] for j in g)
            if padded <= max(PAD_FREE, 1.25 * sum(wide[j][0] * wide[j][1] for j in g)):
                groups[-1] = g
                continue
        groups.append([i])
    return groups


def lr_ratio(rows: int, cols: int) -> float:
    """torch.optim.Muon's default ("original") lr adjustment: sqrt(max(1, rows / cols))."""
    return math.sqrt(max(1.0, rows / cols))


def _columns_last(t: torch.Tensor) -> bool:
    """Whether a filter's columns are best viewed (kh, kw, in): it is channels_last, not plain."""
    return t.ndim == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last)


def as_matrix(t: torch.Tensor, columns_last: bool) -> torch.Tensor:
    """(out, rest) matrix of a filter bank with the column order `columns_last` names: a view of the
    same storage where the layout allows (parameters and their buffers), a copy otherwise."""
    if columns_last:
        t = t.permute(0, 2, 3, 1)
    return t.reshape(t.shape[0], -1)


def matrix_view(t: torch.Tensor, columns_last: bool) -> torch.Tensor:
    """`as_matrix` that must share storage: the optimizer writes through it."""
    m = as_matrix(t.detach(), columns_last)
    if m.data_ptr() != t.data_ptr():  # reshape had to copy
        raise ValueError(f"a filter of shape {tuple(t.shape)} and strides {t.stride()} has no 2-D view")
    return m


class MuonSGD(torch.optim.Optimizer):
    """Groups with `muon=True` take Muon's step (lr, momentum, Nesterov, `ns_steps` iterations,
    decoupled weight decay, optionally `normalize`d filters); every other group takes SGD with
    Nesterov momentum and its own coupled weight decay. `impl`: {"fused": True} or
    {"foreach": True} for the SGD part. `use_torch_muon`: torch.optim.Muon's per-parameter step
    instead of the batched one (the same arithmetic, in bf16). `ns_dtype`: the batched step's iteration dtype;
    None: `ns_dtype(device)` of the filters (fp32 on a CPU that emulates bf16)."""

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        ns_steps: int = 3,
        impl: dict | None = None,
        use_torch_muon: bool = False,
        ns_dtype: torch.dtype | None = None,
    ) -> None:
        defaults = dict(
            lr=lr, momentum=momentum, weight_decay=weight_decay, muon=False, normalize=False, ns_steps=ns_steps
        )
        super().__init__(params, defaults)
        self.impl = impl or {}
        for group in self.param_groups:
            if group["muon"]:
                for p in group["params"]:
                    if p.ndim < 2:
                        raise ValueError(f"MuonSGD: a Muon group holds a parameter of shape {tuple(p.shape)}")
        if use_torch_muon and not torch_muon_available():
            raise ValueError(
                f"MuonSGD: use_torch_muon needs torch.optim.Muon (torch 2.9 or later), this is {torch.__version__}"
            )
        self.use_torch_muon = use_torch_muon
        self.ns_dtype = ns_dtype
        self._inner = self._build_inner() if use_torch_muon else None
        self._buckets: dict[tuple, list[list[int]]] = {}  # pad_buckets by the shapes of a step's filters

    def _build_inner(self):
        """torch.optim.Muon over 2-D views of this optimizer's filters, one group per Muon group (in
        order, empty ones too, so the k-th Muon group here is the k-th there, also after
        load_state_dict replaces the group dicts); its momentum buffers are bound to this
        optimizer's (which checkpoints save) before every step."""
        self._views = {}
        groups = []
        for group in self.param_groups:
            if group["muon"]:
                views = []
                for p in group["params"]:
                    self._views[p] = matrix_view(p, _columns_last(p))
                    views.append(self._views[p])
                groups.append({"params": views})
        if not groups:
            return None
        return torch.optim.Muon(groups, lr=1.0, weight_decay=0.0, ns_coefficients=NS_COEFFICIENTS, eps=EPS)

    def _buffer(self, p: torch.Tensor) -> torch.Tensor:
        """The momentum buffer of filter p, laid out like p (so it has p's 2-D view)."""
        state = self.state[p]
        buf = state.get("momentum_buffer")
        if buf is None or buf.stride() != p.stride():
            fresh = torch.zeros_like(p, memory_format=torch.preserve_format)
            if buf is not None:  # a loaded checkpoint's buffer in another memory format
                fresh.copy_(buf)
            state["momentum_buffer"] = buf = fresh
        return buf

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        muon_groups = [group for group in self.param_groups if group["muon"]]
        for group in self.param_groups:
            if not group["muon"]:
                self._sgd_step(group)
        for group in muon_groups:
            self._normalize(group)
        if self._inner is not None:
            self._torch_muon_step(muon_groups)
        else:
            for group in muon_groups:
                self._batched_step(group)
        return loss

    def _sgd_step(self, group: dict) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        buffers = [self.state[p].get("momentum_buffer") for p in params]
        sgd(
            params,
            [p.grad for p in params],
            buffers,
            weight_decay=group["weight_decay"],
            momentum=group["momentum"],
            lr=group["lr"],
            dampening=0.0,
            nesterov=True,
            maximize=False,
            **self.impl,
        )
        for p, buf in zip(params, buffers):  # sgd fills in the buffers it created on the first step
            self.state[p]["momentum_buffer"] = buf

    @staticmethod
    def _normalize(group: dict) -> None:
        if not group["normalize"]:
            return
        params = [p for p in group["params"] if p.grad is not None]
        if params:
            torch._foreach_div_(params, torch._foreach_norm(params))
            torch._foreach_mul_(params, [math.sqrt(p.shape[0]) for p in params])

    def _torch_muon_step(self, muon_groups: list[dict]) -> None:
        inner_groups = self._inner.param_groups
        for group, inner in zip(muon_groups, inner_groups):
            inner.update(
                lr=group["lr"],
                momentum=group["momentum"],
                weight_decay=group["weight_decay"],
                nesterov=True,
                ns_steps=group["ns_steps"],
            )
            for p in group["params"]:
                view = self._views[p]
                if p.grad is None:
                    view.grad = None
                    continue
                columns_last = _columns_last(p)
                view.grad = as_matrix(p.grad, columns_last)
                self._inner.state[view]["momentum_buffer"] = matrix_view(self._buffer(p), columns_last)
        self._inner.step()
        for view in self._views.values():
            view.grad = None  # the 2-D grads are views of (or copies from) this step's gradients

    def _batched_step(self, group: dict) -> None:
        """torch.optim.Muon's step on every filter of the group at once: lerp the momentum, take
        the Nesterov mix, orthogonalise (`orthogonalize_many`), decay, add."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        momentum, lr = group["momentum"], group["lr"]
        bufs = [self._buffer(p) for p in params]  # laid out like p, as its gradient is
        grads = [p.grad for p in params]
        torch._foreach_lerp_(bufs, grads, 1 - momentum)  # torch.optim.Muon's rule: an average, not a sum
        mixed = torch._foreach_lerp(grads, bufs, momentum)
        layouts = [_columns_last(p) for p in params]
        mats = [as_matrix(m, cl) for m, cl in zip(mixed, layouts)]
        key = tuple(m.shape for m in mats)
        if key not in self._buckets:
            self._buckets[key] = pad_buckets([tuple(m.shape) for m in mats])
        dtype = self.ns_dtype or ns_dtype(params[0].device)
        if group["weight_decay"]:  # decoupled, as torch.optim.Muon's
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        for bucket in self._buckets[key]:
            updates = orthogonalize_many([mats[i] for i in bucket], group["ns_steps"], dtype=dtype)
            for i, update in zip(bucket, updates):
                rows, cols = update.shape
                matrix_view(params[i], layouts[i]).add_(update, alpha=-lr * lr_ratio(rows, cols))
