"""cnn3 as a symbolic graph on PyTensor, Theano's maintained successor (the Lasagne lineage).

Lasagne itself is not offered: Lasagne 0.1 on PyPI needs Theano <= 0.8, Lasagne's later code was
never released, and neither installs on a current Python. This runner builds the same network
the way a Lasagne user would have (shared variables, `pytensor.grad`, hand-written updates, one
compiled train function) on `pytensor==2.30.x`, the last line with `pytensor.tensor.conv.conv2d`.

Single device only: PyTensor has no data-parallel API; `--devices N` is reported and ignored.
The conv ops are lowered to im2col + GEMM by `pytensor_conv` (see there why). Max pooling is a
reshape and a one-hot argmax (PyTensor dropped Theano's pool op; see `max_pool_2x2`). The compile mode is PYTENSOR_MODE
(default FAST_RUN: the C linker; its first compile takes minutes and is cached in
~/.pytensor; FAST_COMPILE runs the same graph on the Python linker with NumPy and BLAS kernels).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from cnnpar.frameworks.spec import (
    ADAM_BETAS,
    ADAM_EPSILON,
    BN_EPSILON,
    BN_MOMENTUM_TORCH,
    Framework,
    RunSpec,
    base_header,
    blas_threads,
    cpu_name,
    epoch_order,
    epoch_row,
    initial_weights,
    load_arrays,
    log_epoch,
    runner_main,
    steps_per_epoch,
)


def max_pool_2x2(pt, h):
    """2x2 max pooling, stride 2, odd edges dropped (PyTorch's floor mode), over NCHW.

    The gradient goes to one element per window, the first maximum in row-major order, as PyTorch's CPU kernel
    and TensorFlow's route it. A plain `max` would send it to every tied maximum (PyTensor's max gradient), and
    ties are common: ~5 % of the first layer's windows on digit images (zero backgrounds after ReLU), enough for
    PyTensor to train another model from the same weights. PyTensor 2.30 has no pool op (Theano's was dropped),
    so the window's argmax picks the element as a one-hot mask; the mask, a comparison, carries no gradient."""
    side = h.shape[2] // 2
    n, c = h.shape[0], h.shape[1]
    h = h[:, :, : 2 * side, : 2 * side].reshape((n, c, side, 2, side, 2))
    windows = h.dimshuffle(0, 1, 2, 4, 3, 5).reshape((n, c, side, side, 4))  # each window's 4 in row-major order
    first_max = pt.eq(pt.arange(4), pt.argmax(windows, axis=-1, keepdims=True))
    return (windows * first_max.astype(windows.dtype)).sum(axis=-1)


def build_functions(pytensor, pt, weights: dict, shape, lr: float):
    """Compiled train(x, y) -> (loss sum, correct) with updates, and evaluate(x, y) -> the same."""
    from pytensor.tensor.conv import conv2d

    def shared(v, name):
        return pytensor.shared(np.asarray(v, dtype=np.float32), name=name)

    convs = [shared(w, f"conv{i}") for i, w in enumerate(weights["conv"])]
    gammas = [shared(g, f"gamma{i}") for i, (g, _, _, _) in enumerate(weights["bn"])]
    betas = [shared(b, f"beta{i}") for i, (_, b, _, _) in enumerate(weights["bn"])]
    run_means = [shared(m, f"mean{i}") for i, (_, _, m, _) in enumerate(weights["bn"])]
    run_vars = [shared(v, f"var{i}") for i, (_, _, _, v) in enumerate(weights["bn"])]
    dense_w = [shared(w.T, f"W{i}") for i, (w, _) in enumerate(weights["dense"])]  # (in, out)
    dense_b = [shared(b, f"b{i}") for i, (_, b) in enumerate(weights["dense"])]
    params = [*convs, *gammas, *betas, *dense_w, *dense_b]

    x = pt.tensor4("x", dtype="float32")
    y = pt.vector("y", dtype="int64")

    def forward(h, training: bool):
        stat_updates = []
        for i, k in enumerate(convs):
            h = conv2d(h, k, filter_shape=weights["conv"][i].shape, border_mode="half", filter_flip=False)
            if training:
                mean = h.mean(axis=(0, 2, 3))
                var = h.var(axis=(0, 2, 3))
                n = h.shape[0] * h.shape[2] * h.shape[3]
                unbiased = var * n / (n - 1)  # PyTorch's running_var is unbiased; so is this one
                m = np.float32(BN_MOMENTUM_TORCH)
                stat_updates += [
                    (run_means[i], (1 - m) * run_means[i] + m * mean),
                    (run_vars[i], (1 - m) * run_vars[i] + m * unbiased.astype("float32")),
                ]
            else:
                mean, var = run_means[i], run_vars[i]
            h = (h - mean.dimshuffle("x", 0, "x", "x")) / pt.sqrt(var.dimshuffle("x", 0, "x", "x") + BN_EPSILON)
            h = h * gammas[i].dimshuffle("x", 0, "x", "x") + betas[i].dimshuffle("x", 0, "x", "x")
            h = max_pool_2x2(pt, pt.maximum(h, 0))
        h = h.flatten(2)  # N, C*H*W: PyTorch's flatten order, so the shared weights fit as they are
        for i, (w, b) in enumerate(zip(dense_w, dense_b)):
            h = pt.dot(h, w) + b
            if i < len(dense_w) - 1:
                h = pt.maximum(h, 0)
        return h, stat_updates

    def loss_and_correct(logits):
        logp = logits - pt.logsumexp(logits, axis=1, keepdims=True)
        per_example = -logp[pt.arange(y.shape[0]), y]
        return per_example, pt.eq(pt.argmax(logits, axis=1), y).sum()

    logits, stat_updates = forward(x, training=True)
    per_example, correct = loss_and_correct(logits)
    grads = pytensor.grad(per_example.mean(), params)

    # Adam, written out: PyTensor has no optimizer library (Lasagne's `updates.adam` lived above it).
    b1, b2 = ADAM_BETAS
    t = pytensor.shared(np.float32(0.0), name="t")
    t_next = t + 1
    step = np.float32(lr) * pt.sqrt(1 - b2**t_next) / (1 - b1**t_next)
    updates = [(t, t_next), *stat_updates]
    for p, g in zip(params, grads):
        m = pytensor.shared(np.zeros_like(p.get_value()), name=f"m_{p.name}")
        v = pytensor.shared(np.zeros_like(p.get_value()), name=f"v_{p.name}")
        m_new = b1 * m + (1 - b1) * g
        v_new = b2 * v + (1 - b2) * g * g
        updates += [(m, m_new), (v, v_new), (p, p - step * m_new / (pt.sqrt(v_new) + ADAM_EPSILON))]
    mode = os.environ.get("PYTENSOR_MODE", "FAST_RUN")
    train = pytensor.function([x, y], [per_example.sum(), correct], updates=updates, mode=mode)
    eval_logits, _ = forward(x, training=False)
    eval_per_example, eval_correct = loss_and_correct(eval_logits)
    evaluate = pytensor.function([x, y], [eval_per_example.sum(), eval_correct], mode=mode)
    return train, evaluate, mode


def train(fw: Framework, spec: RunSpec) -> tuple[dict, list[dict]]:
    import pytensor
    import pytensor.tensor as pt

    from cnnpar.frameworks import pytensor_conv

    pytensor.config.floatX = "float32"
    pytensor_conv.register()
    if spec.devices > 1:
        print(f"{fw.name}: PyTensor has no data-parallel API; --devices {spec.devices} ignored, 1 device", flush=True)
    data = load_arrays(spec)
    weights = initial_weights(data.shape, data.num_classes, spec.seed)
    t0 = time.perf_counter()
    train_fn, eval_fn, mode = build_functions(pytensor, pt, weights, data.shape, spec.lr)
    compile_s = time.perf_counter() - t0
    print(f"{fw.name}: compiled ({mode}) in {compile_s:.1f} s, outside the timed epochs", flush=True)
    b = spec.batch_size
    steps = steps_per_epoch(len(data.x_train), b)
    rows = []
    for epoch in range(1, spec.epochs + 1):
        order = epoch_order(len(data.x_train), epoch, spec.seed)
        loss_sum, correct = 0.0, 0
        t0 = time.perf_counter()
        for s in range(steps):
            idx = order[s * b : (s + 1) * b]
            loss, right = train_fn(data.x_train[idx], data.y_train[idx])
            loss_sum += float(loss)
            correct += int(right)
        seconds = time.perf_counter() - t0
        vloss, vright = 0.0, 0
        for s in range(0, len(data.x_val), b):
            loss, right = eval_fn(data.x_val[s : s + b], data.y_val[s : s + b])
            vloss += float(loss)
            vright += int(right)
        n = steps * b
        row = epoch_row(epoch, loss_sum / n, correct / n, vloss / len(data.x_val), vright / len(data.x_val), seconds, n)
        log_epoch(fw, spec, row)
        rows.append(row)
    header = base_header(fw, spec, data)
    header.update(
        {
            "pytensor": pytensor.__version__,
            "pytensor_mode": mode,
            "pytensor_linker": linker_ran(train_fn),
            "intra_op_threads": f"BLAS: {blas_threads()}",
            "timed": (
                f"compiled before epoch 1 ({compile_s:.1f} s, in no epoch); each epoch the training steps, "
                "each batch indexed from the arrays inside the timed loop"
            ),
            "compile_s": f"{compile_s:.2f}",
            "device": cpu_name(),
            "device_type": "cpu",
            "devices_requested": str(spec.devices),
            "devices_used": "1",
            "parallelism": "none: PyTensor has no data-parallel API (single device)",
            "layout": "NCHW",
            "conv": "pytensor.tensor.conv.conv2d, lowered to im2col + GEMM (cnnpar.frameworks.pytensor_conv)",
        }
    )
    return header, rows


def linker_ran(fn) -> str:
    """The linker the compiled function runs on (its mode's, not pytensor.config.linker, which a mode or
    PYTENSOR_FLAGS=cxx= overrides): VMLinker with C thunks and the C loop is "cvm", without C the Python one."""
    linker = fn.maker.linker
    parts = [type(linker).__name__]
    for attr in ("use_cloop", "c_thunks"):
        if hasattr(linker, attr):
            parts.append(f"{attr}={getattr(linker, attr)}")
    return " ".join(parts)


if __name__ == "__main__":
    sys.exit(runner_main("pytensor_runner", train))
