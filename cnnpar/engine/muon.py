"""Muon for convolution filters and SGD with Nesterov momentum for the rest, as one optimizer.

Muon (Keller Jordan, 2024) replaces a weight matrix's momentum-averaged gradient by a nearby
semi-orthogonal matrix (singular values near one), found with a few Newton-Schulz iterations, so
every direction the layer can move in moves by about as much. A filter bank of shape (out, in, kh,
kw) is the (out, in * kh * kw) matrix it multiplies image patches with, and Muon sees it so.

`torch.optim.Muon` (torch 2.9 and later) accepts only 2-D parameters, so it is handed 2-D views of
the filters: the same storage, and its in-place update moves the filters. A channels_last filter
is viewed with its columns ordered (kh, kw, in) instead of (in, kh, kw): orthogonalisation commutes
with a permutation of columns, so the update is the same. Where torch has no Muon, `orthogonalize`
below runs the same iteration, with the same coefficients and the same momentum rule.

airbench94_muon also rescales each filter bank to Frobenius norm sqrt(out) before every step
(`normalize`). Its filters all feed BatchNorm, so only their direction matters; a fixed norm keeps
the step a fixed angle instead of one that shrinks as the weights grow, and replaces weight decay.

Why one optimizer object: the trainer, its lr schedule (one LambdaLR scales every group), the fp16
GradScaler and checkpoints all expect one. A Muon group is an ordinary param group marked
`muon=True`; every other group takes torch's own SGD (`torch.optim.sgd.sgd`, fused on CUDA).
"""

from __future__ import annotations

import math

import torch
from torch.optim.sgd import sgd

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic, as torch.optim.Muon uses
EPS = 1e-7


def torch_muon_available() -> bool:
    return hasattr(torch.optim, "Muon")


def orthogonalize(g: torch.Tensor, steps: int, coefficients=NS_COEFFICIENTS, eps: float = EPS) -> torch.Tensor:
    """Newton-Schulz iteration towards the orthogonal factor of the 2-D `g`, in bf16: the same
    operations, in the same order, as torch.optim.Muon's (so the two agree where both exist). It
    stops short of converging on purpose: singular values end spread around one, which trains as
    well as the exact factor at a fraction of the cost."""
    if g.ndim != 2:
        raise ValueError(f"orthogonalize: expected a 2-D matrix, got shape {tuple(g.shape)}")
    a, b, c = coefficients
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm <= Frobenius norm <= 1: inside the iteration's basin
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


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
    {"foreach": True} for the SGD part."""

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        ns_steps: int = 3,
        impl: dict | None = None,
        use_torch_muon: bool | None = None,
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
        self.use_torch_muon = torch_muon_available() if use_torch_muon is None else use_torch_muon
        self._inner = self._build_inner() if self.use_torch_muon else None

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
                self._fallback_step(group)
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

    def _fallback_step(self, group: dict) -> None:
        momentum, lr = group["momentum"], group["lr"]
        for p in group["params"]:
            if p.grad is None:
                continue
            columns_last = _columns_last(p)
            g = as_matrix(p.grad, columns_last)
            buf = matrix_view(self._buffer(p), columns_last)
            buf.lerp_(g, 1 - momentum)  # torch.optim.Muon's rule: an average, not a sum (same direction)
            update = orthogonalize(g.lerp(buf, momentum), group["ns_steps"])
            rows, cols = update.shape
            if group["weight_decay"]:  # decoupled, as torch.optim.Muon's
                p.mul_(1 - lr * group["weight_decay"])
            matrix_view(p, columns_last).add_(update, alpha=-lr * lr_ratio(rows, cols))
