"""cnn3 in plain TensorFlow: tf.Variable weights, tf.GradientTape, a tf.function train step.

No Keras: TensorFlow >= 2.16 ships Keras 3 as tf.keras, so a "plain TF" runner that used tf.keras
would measure Keras again. Layers are tf.nn ops; Adam is written out.

Data parallelism is `tf.distribute.MirroredStrategy` (on a CPU, over N logical CPU devices). One
path serves every device count: with one device the default strategy runs the same code. Trainable
variables and Adam slots are mirrored with ONLY_FIRST_REPLICA aggregation (every replica computes
the same update from the all-reduced gradient); BatchNorm running statistics are ON_READ
variables averaged over replicas when read, like Keras 2's BatchNormalization under a strategy.
"""

from __future__ import annotations

import sys
import time

from cnnpar.frameworks.spec import (
    ADAM_BETAS,
    ADAM_EPSILON,
    BN_EPSILON,
    BN_MOMENTUM_TORCH,
    Framework,
    RunSpec,
    base_header,
    conv_hwio,
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
)


def make_strategy(tf, n: int):
    """(strategy, its description, the device names it trains on: [] for the default strategy)."""
    if n <= 1:
        return tf.distribute.get_strategy(), "none (1 device, the default strategy)", []
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= n:
        names = [f"/gpu:{i}" for i in range(n)]
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        names = [f"/cpu:{i}" for i in range(n)]
    kind = "GPUs" if names[0].startswith("/gpu") else "logical CPU devices"
    return (
        tf.distribute.MirroredStrategy(devices=names),
        f"tf.distribute.MirroredStrategy over {kind} {','.join(names)}",
        names,
    )


class CNN3:
    """Variables and the forward pass (NHWC), built inside the strategy's scope."""

    def __init__(self, tf, weights: dict, side_after_convs: int) -> None:
        from cnnpar.models.cnn3 import CONV_CHANNELS

        mirrored = dict(aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        on_read = dict(
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.MEAN,
        )
        self.tf = tf
        self.convs = [tf.Variable(conv_hwio(k), **mirrored) for k in weights["conv"]]
        self.gammas = [tf.Variable(g, **mirrored) for g, _, _, _ in weights["bn"]]
        self.betas = [tf.Variable(b, **mirrored) for _, b, _, _ in weights["bn"]]
        self.run_means = [tf.Variable(m, **on_read) for _, _, m, _ in weights["bn"]]
        self.run_vars = [tf.Variable(v, **on_read) for _, _, _, v in weights["bn"]]
        (w0, b0), *rest = weights["dense"]
        ws = [first_dense_for_nhwc(w0, CONV_CHANNELS[-1], side_after_convs)] + [dense_in_out(w) for w, _ in rest]
        self.dense_w = [tf.Variable(w, **mirrored) for w in ws]
        self.dense_b = [tf.Variable(b, **mirrored) for b in [b0] + [b for _, b in rest]]
        self.trainable = [*self.convs, *self.gammas, *self.betas, *self.dense_w, *self.dense_b]
        self.m = [tf.Variable(tf.zeros_like(v), **mirrored) for v in self.trainable]
        self.v = [tf.Variable(tf.zeros_like(v), **mirrored) for v in self.trainable]
        self.t = tf.Variable(0.0, **mirrored)

    def __call__(self, x, training: bool):
        tf = self.tf
        for i, k in enumerate(self.convs):
            x = tf.nn.conv2d(x, k, strides=1, padding="SAME")
            if training:
                mean, var = tf.nn.moments(x, axes=[0, 1, 2])
                n = tf.cast(tf.reduce_prod(tf.shape(x)[:3]), tf.float32)
                m = BN_MOMENTUM_TORCH
                self.run_means[i].assign((1 - m) * self.run_means[i] + m * mean)
                self.run_vars[i].assign((1 - m) * self.run_vars[i] + m * var * n / (n - 1))  # unbiased, as PyTorch
            else:
                mean, var = self.run_means[i], self.run_vars[i]
            x = tf.nn.batch_normalization(x, mean, var, self.betas[i], self.gammas[i], BN_EPSILON)
            x = tf.nn.max_pool2d(tf.nn.relu(x), 2, 2, "VALID")
        x = tf.reshape(x, [tf.shape(x)[0], -1])
        for i, (w, b) in enumerate(zip(self.dense_w, self.dense_b)):
            x = tf.matmul(x, w) + b
            if i < len(self.dense_w) - 1:
                x = tf.nn.relu(x)
        return x

    def adam(self, grads, lr: float) -> None:
        tf = self.tf
        b1, b2 = ADAM_BETAS
        self.t.assign_add(1.0)
        t = self.t.read_value()
        step = lr * tf.sqrt(1.0 - b2**t) / (1.0 - b1**t)
        for p, g, m, v in zip(self.trainable, grads, self.m, self.v):
            m.assign(b1 * m + (1 - b1) * g)
            v.assign(b2 * v + (1 - b2) * tf.square(g))
            p.assign_sub(step * m / (tf.sqrt(v) + ADAM_EPSILON))


def train(fw: Framework, spec: RunSpec) -> tuple[dict, list[dict]]:
    import tensorflow as tf

    strategy, parallelism, strategy_devices = make_strategy(tf, spec.devices)  # before any op initialises the runtime
    tf.random.set_seed(spec.seed)
    data = load_arrays(spec).channels_last()
    weights = initial_weights(data.shape, data.num_classes, spec.seed)
    side = data.shape[1] // 8
    with strategy.scope():
        model = CNN3(tf, weights, side)
    b = spec.batch_size
    steps = steps_per_epoch(len(data.x_train), b)
    x_all = tf.constant(data.x_train)
    y_all = tf.constant(data.y_train)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            loss = tf.reduce_sum(per_example) / b  # / the global batch: the all-reduce sums replicas
        grads = tape.gradient(loss, model.trainable)
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        model.adam(grads, spec.lr)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        return tf.reduce_sum(per_example), correct

    @tf.function
    def train_step(batch):
        loss, correct = strategy.run(replica_step, args=batch)
        return strategy.reduce("SUM", loss, axis=None), strategy.reduce("SUM", correct, axis=None)

    @tf.function(reduce_retracing=True)
    def eval_step(x, y):
        logits = model(x, training=False)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        return tf.reduce_sum(per_example), tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))

    rows = []
    for epoch in range(1, spec.epochs + 1):
        order = epoch_order(len(data.x_train), epoch, spec.seed)[: steps * b]
        ds = (
            tf.data.Dataset.from_tensor_slices(order)
            .batch(b, drop_remainder=True)
            .map(lambda i: (tf.gather(x_all, i), tf.gather(y_all, i)))
            .prefetch(2)
        )
        dist = strategy.experimental_distribute_dataset(ds)
        loss_sum, correct = 0.0, 0.0
        t0 = time.perf_counter()
        for batch in dist:
            loss, right = train_step(batch)
            loss_sum += float(loss)  # note: a host sync per step, as Keras's progress metrics also do
            correct += float(right)
        seconds = time.perf_counter() - t0
        vloss, vright = 0.0, 0.0
        for s in range(0, len(data.x_val), b):
            loss, right = eval_step(data.x_val[s : s + b], data.y_val[s : s + b])
            vloss += float(loss)
            vright += float(right)
        n = steps * b
        nv = len(data.x_val)
        row = epoch_row(epoch, loss_sum / n, correct / n, vloss / nv, vright / nv, seconds, n)
        log_epoch(fw, spec, row)
        rows.append(row)
    header = base_header(fw, spec, data)
    header.update(
        {
            "tensorflow": tf.__version__,
            **tf_device(tf, strategy_devices),
            "devices_requested": str(spec.devices),
            "devices_used": str(strategy.num_replicas_in_sync),
            "parallelism": parallelism,
            "layout": "NHWC",
            "matmul_precision": tf_precision(tf),
            "intra_op_threads": tf_threads(tf),
            "timed": (
                "epoch 1 includes tf.function tracing (no XLA jit); each epoch the training steps, tf.data "
                "gathering each batch from the arrays inside the timed loop"
            ),
        }
    )
    return header, rows


if __name__ == "__main__":
    sys.exit(runner_main("tf_runner", train))
