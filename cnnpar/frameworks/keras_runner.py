"""cnn3 under Keras 3 on the backend named by KERAS_BACKEND (tensorflow, jax or torch).

`compare` starts one process per backend with KERAS_BACKEND set, so the switch is real: Keras
reads it once, at import. Data parallelism (`--devices N`) in each backend's own idiom:
- jax: `keras.distribution.DataParallel` over N devices (on a CPU, N virtual host devices made
  with XLA_FLAGS=--xla_force_host_platform_device_count=N, set before JAX is imported);
- tensorflow: `tf.distribute.MirroredStrategy` over N devices (on a CPU, N logical CPU devices);
- torch: Keras 3 has no data-parallel API on the PyTorch backend, so the run uses one device and
  the CSV's `parallelism` line says so.
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
    conv_hwio,
    cpu_name,
    dense_in_out,
    epoch_order,
    epoch_row,
    first_dense_for_nhwc,
    initial_weights,
    load_arrays,
    log_epoch,
    runner_main,
    steps_per_epoch,
    tf_device,
    tf_precision,
    tf_threads,
    torch_threads,
    xla_threads,
)

NO_TORCH_DP = (
    "none: Keras 3 has no data-parallel API on the PyTorch backend (keras.distribution is JAX-only; "
    "tf.distribute is TensorFlow-only); ran on 1 device"
)


def prepare_devices(backend: str, n: int) -> tuple[str, object, list[str]]:
    """Set up N devices before the backend initialises; returns (description, strategy or None, the device
    names a TensorFlow strategy trains on)."""
    if n <= 1:
        return "none (1 device)", None, []
    if backend == "jax":
        flag = f"--xla_force_host_platform_device_count={n}"
        if flag not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        return "keras.distribution.DataParallel", None, []
    if backend == "tensorflow":
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if len(gpus) >= n:
            names = [f"/gpu:{i}" for i in range(n)]
            how = "tf.distribute.MirroredStrategy over GPUs"
        else:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
            names = [f"/cpu:{i}" for i in range(n)]
            how = "tf.distribute.MirroredStrategy over logical CPU devices"
        return f"{how} {','.join(names)}", tf.distribute.MirroredStrategy(devices=names), names
    print(f"keras-{backend}: {NO_TORCH_DP}", flush=True)
    return NO_TORCH_DP, None, []


def build_model(keras, shape_chw, num_classes: int, weights: dict):
    from cnnpar.models.cnn3 import CONV_CHANNELS, FC_UNITS

    c, h, w = shape_chw
    layers = keras.layers
    inputs = keras.Input((h, w, c))
    x, convs, bns = inputs, [], []
    for out in CONV_CHANNELS:
        conv = layers.Conv2D(out, 3, padding="same", use_bias=False)
        bn = layers.BatchNormalization(momentum=1.0 - BN_MOMENTUM_TORCH, epsilon=BN_EPSILON)
        x = layers.MaxPooling2D(2)(layers.ReLU()(bn(conv(x))))
        convs.append(conv)
        bns.append(bn)
    side = x.shape[1]
    x = layers.Flatten()(x)
    dense = [layers.Dense(FC_UNITS[0], activation="relu"), layers.Dense(FC_UNITS[1], activation="relu")]
    dense.append(layers.Dense(num_classes))
    for d in dense:
        x = d(x)
    model = keras.Model(inputs, x, name="cnn3")
    # The shared initial weights (PyTorch layouts) converted to Keras's NHWC layouts.
    for layer, k in zip(convs, weights["conv"]):
        layer.set_weights([conv_hwio(k)])
    for layer, stats in zip(bns, weights["bn"]):
        layer.set_weights(list(stats))
    (w0, b0), *rest = weights["dense"]
    dense[0].set_weights([first_dense_for_nhwc(w0, CONV_CHANNELS[-1], side), b0])
    for layer, (wi, bi) in zip(dense[1:], rest):
        layer.set_weights([dense_in_out(wi), bi])
    return model


def backend_versions(backend: str, strategy_devices: list[str]) -> dict[str, str]:
    if backend == "jax":
        import jax
        import jaxlib

        devs = jax.devices()
        precision = jax.config.jax_default_matmul_precision
        return {
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "device": devs[0].device_kind if devs[0].platform != "cpu" else cpu_name(),
            "device_type": devs[0].platform,
            "intra_op_threads": xla_threads(),
            # recorded, not pinned: the backend's default (reduced precision, TF32-like, on recent GPUs)
            "matmul_precision": f"jax_default_matmul_precision={precision or 'default'}",
        }
    if backend == "tensorflow":
        import tensorflow as tf

        return {
            "tensorflow": tf.__version__,
            **tf_device(tf, strategy_devices),
            "intra_op_threads": tf_threads(tf),
            "matmul_precision": tf_precision(tf),
        }
    import torch

    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else cpu_name(),
        "device_type": "cuda" if cuda else "cpu",
        "intra_op_threads": torch_threads(),
        "matmul_precision": (
            f"torch matmul allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
            f"cudnn allow_tf32={torch.backends.cudnn.allow_tf32}"
        ),
    }


def timed_line(backend: str, jit_compile) -> str:
    """What each timed epoch holds. JAX and TensorFlow trace (and compile) the train step in epoch 1; on the
    PyTorch backend Keras runs it eagerly unless jit_compile: there is no compile in epoch 1 to point at."""
    first = (
        "eager (no tracing/compilation)"
        if backend == "torch" and not jit_compile
        else "epoch 1 includes tracing/compilation"
    )
    return (
        f"{first}; each epoch model.fit over the training steps (the epoch's shuffled arrays are gathered "
        "before the clock starts)"
    )


def evaluate(model, x: np.ndarray, y: np.ndarray, batch_size: int) -> tuple[float, float]:
    """Loss and accuracy over the whole validation set, every sample once.

    The set is padded to whole batches and the padding dropped from the logits: a sharded
    (DataParallel) model cannot take a last batch that does not split evenly over its devices,
    which `model.evaluate` would hand it."""
    n = len(x)
    pad = -n % batch_size
    if pad:
        x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), dtype=x.dtype)])
    logits = np.asarray(model.predict(x, batch_size=batch_size, verbose=0), dtype=np.float64)[:n]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(n), y].mean()
    return float(loss), float((logits.argmax(axis=1) == y).mean())


def train(fw: Framework, spec: RunSpec) -> tuple[dict, list[dict]]:
    backend = fw.keras_backend
    os.environ["KERAS_BACKEND"] = backend  # compare sets it too; Keras reads it once, at import
    parallelism, strategy, strategy_devices = prepare_devices(backend, spec.devices)
    import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(f"Keras picked backend {keras.backend.backend()!r}, expected {backend!r}")
    keras.utils.set_random_seed(spec.seed)
    devices_used = 1
    if backend == "jax" and spec.devices > 1:
        devices = keras.distribution.list_devices()[: spec.devices]
        if len(devices) < spec.devices:
            raise RuntimeError(f"JAX sees {len(devices)} devices, {spec.devices} asked for")
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        parallelism = f"keras.distribution.DataParallel over {','.join(map(str, devices))}"
        devices_used = len(devices)
    elif strategy is not None:
        devices_used = strategy.num_replicas_in_sync

    data = load_arrays(spec).channels_last()
    weights = initial_weights(data.shape, data.num_classes, spec.seed)

    def build_and_compile():
        model = build_model(keras, data.shape, data.num_classes, weights)
        model.compile(
            optimizer=keras.optimizers.Adam(
                learning_rate=spec.lr, beta_1=ADAM_BETAS[0], beta_2=ADAM_BETAS[1], epsilon=ADAM_EPSILON
            ),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc")],
        )
        return model

    if strategy is not None:
        with strategy.scope():
            model = build_and_compile()
    else:
        model = build_and_compile()

    b = spec.batch_size
    n = steps_per_epoch(len(data.x_train), b) * b
    rows = []
    for epoch in range(1, spec.epochs + 1):
        idx = epoch_order(len(data.x_train), epoch, spec.seed)[:n]
        xs, ys = data.x_train[idx], data.y_train[idx]
        t0 = time.perf_counter()
        hist = model.fit(xs, ys, batch_size=b, epochs=1, shuffle=False, verbose=0)
        seconds = time.perf_counter() - t0
        val_loss, val_acc = evaluate(model, data.x_val, data.y_val, b)
        row = epoch_row(epoch, hist.history["loss"][-1], hist.history["acc"][-1], val_loss, val_acc, seconds, n)
        log_epoch(fw, spec, row)
        rows.append(row)
    header = base_header(fw, spec, data)
    header.update(
        {
            "keras": keras.__version__,
            **backend_versions(backend, strategy_devices),
            "devices_requested": str(spec.devices),
            "devices_used": str(devices_used),
            "parallelism": parallelism,
            "layout": "NHWC",
            "jit_compile": str(getattr(model, "jit_compile", "")),
            "timed": timed_line(backend, getattr(model, "jit_compile", "")),
            "note": "Keras's BN running variance is the biased one",
        }
    )
    return header, rows


if __name__ == "__main__":
    sys.exit(runner_main("keras_runner", train))
