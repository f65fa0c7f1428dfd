"""ResNet-50 on synthetic ImageNet-shaped data with the large-minibatch SGD recipe.

The control workload: every gradient of ResNet-50 (convolutions, batch norm, the classifier) is
dense, so Horovod reduces them all by allreduce and per-rank memory must stay flat as ranks are added.

The recipe is Goyal et al.'s "Accurate, Large Minibatch SGD": momentum SGD whose learning rate is the
base rate scaled by global batch / 256, reached by a linear warm-up and then decayed (step or cosine),
with optional label smoothing.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from memdiag.workloads.configs import PRESETS, ResNetConfig, with_overrides
from memdiag.workloads.data import batch_rng
from memdiag.workloads.loop import WorkloadContext, train

MOMENTUM = 0.9
REFERENCE_BATCH = 256  # the global batch the base learning rate is quoted for
DECAYS = ("step", "cosine")
# Goyal et al. divide the rate by 10 after 30, 60 and 80 of 90 epochs; here, fractions of the run.
STEP_DECAY_POINTS = (30 / 90, 60 / 90, 80 / 90)


def peak_learning_rate(config: ResNetConfig, world_size: int) -> float:
    """Linear scaling rule: the rate grows with the global batch."""
    return config.base_learning_rate * config.batch_per_rank * world_size / REFERENCE_BATCH


class LargeBatchSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to the peak rate over ``warmup_steps``, then step or cosine decay to ``total_steps``."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int, decay: str):
        if decay not in DECAYS:
            raise ValueError(f"decay {decay!r}: choose one of {', '.join(DECAYS)} (--set decay=cosine)")
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        # Warm-up starts above zero so that step 0 already moves the parameters.
        warmup = self.peak * (step + 1.0) / float(max(1, self.warmup_steps))
        decay_span = float(max(1, self.total_steps - self.warmup_steps))
        progress = tf.clip_by_value((step - float(self.warmup_steps)) / decay_span, 0.0, 1.0)
        if self.decay == "cosine":
            decayed = self.peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
        else:
            drops = tf.add_n([tf.cast(progress >= point, tf.float32) for point in STEP_DECAY_POINTS])
            decayed = self.peak * tf.pow(0.1, drops)
        return tf.where(step < float(self.warmup_steps), warmup, decayed)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps,
                "decay": self.decay}


class Images:
    """Synthetic ImageNet-shaped batches (normalised pixels, uniform labels), a pure function of step."""

    def __init__(self, config: ResNetConfig, seed: int, rank: int):
        self.config, self.seed, self.rank = config, seed, rank

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        c = self.config
        rng = batch_rng(self.seed, self.rank, step)
        images = rng.standard_normal((c.batch_per_rank, c.image_size, c.image_size, 3), dtype=np.float32)
        labels = rng.integers(0, c.num_classes, size=(c.batch_per_rank,), dtype=np.int32)
        return images, labels


def build_model(config: ResNetConfig) -> tf.keras.Model:
    if config.width != "standard":
        raise ValueError(f"width {config.width!r}: only the standard ResNet-50 is built (--set width=standard)")
    # Logits out (no softmax) so that the loss can apply label smoothing stably.
    return tf.keras.applications.ResNet50(weights=None, input_shape=(config.image_size, config.image_size, 3),
                                          classes=config.num_classes, classifier_activation=None)


def run(ctx: WorkloadContext) -> None:
    import horovod.tensorflow as hvd

    config = with_overrides(PRESETS["resnet50"][ctx.preset], ctx.overrides)
    tf.keras.utils.set_random_seed(ctx.seed)  # same initial parameters on every rank
    model = build_model(config)
    schedule = LargeBatchSchedule(peak_learning_rate(config, ctx.size), config.warmup_steps, ctx.steps,
                                  config.decay)
    optimizer = tf.keras.optimizers.SGD(schedule, momentum=MOMENTUM)
    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=config.label_smoothing)
    images = Images(config, ctx.seed, ctx.rank)
    optimizer.build(model.trainable_variables)  # slots made here, not in a second trace

    # One trace, without autograph (the step has no data-dependent Python control flow): step 0
    # traces the graph, and that was most of a short run's time.
    @tf.function(autograph=False)
    def train_step(pixels, labels):
        with tf.GradientTape() as tape:
            logits = model(pixels, training=True)
            loss = loss_fn(tf.one_hot(labels, config.num_classes), logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def step(k: int) -> float:
        return train_step(*images(k)).numpy()

    train(
        ctx,
        variables=lambda: model.trainable_variables,
        train_step=step,
        # All variables, batch-norm moving statistics included: every rank starts from rank 0's model.
        broadcast=lambda: hvd.broadcast_variables(model.variables, root_rank=0),
        items_per_step=config.batch_per_rank,
    )
