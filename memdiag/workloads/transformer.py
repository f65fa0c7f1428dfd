"""Encoder-decoder Transformer for translation, written as ordinary TF 2.15 / Keras code.

Source (and, untied, target) embedding lookups give IndexedSlices gradients, one row per token
occurrence. With ``tie_target_embedding`` the target embedding is also the output softmax matrix,
and TF sums its lookup and matmul gradients into a dense tensor. The ``mixed`` variant adds a large,
truly sparse side table (few lookups per rank), where densifying is the wrong choice.

Two variants of the same training, one per engine (:func:`run` picks it from the context): Horovod's
``DistributedGradientTape`` (gradients averaged over the ranks), or TensorFlow's own
``MultiWorkerMirroredStrategy`` (one worker per rank, gradients summed by the optimizer's
``apply_gradients``, so each worker's loss is divided by the number of workers). Both build the same
model from the same seed, feed each rank its own ``Batches(config, seed, rank)`` and take the same
optimizer steps, so their parameters agree to float rounding. The strategy variant imports no Horovod.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from memdiag.agentconfig import TF_DISTRIBUTE
from memdiag.workloads.configs import PRESETS, TransformerConfig, with_overrides
from memdiag.workloads.data import ZipfTokens, batch_rng
from memdiag.workloads.loop import WorkloadContext, train


def positional_encoding(length: int, depth: int) -> tf.Tensor:
    positions = np.arange(length)[:, None]
    rates = 1 / np.power(10000, (2 * (np.arange(depth)[None, :] // 2)) / depth)
    angles = positions * rates
    angles[:, 0::2] = np.sin(angles[:, 0::2])
    angles[:, 1::2] = np.cos(angles[:, 1::2])
    return tf.constant(angles, dtype=tf.float32)


def attention(config: TransformerConfig) -> tf.keras.layers.MultiHeadAttention:
    # No biases in the projections, as in the reference implementation: a key bias has an
    # identically zero gradient (softmax ignores it), and Adam would turn its float noise into steps.
    return tf.keras.layers.MultiHeadAttention(config.num_heads, config.d_model // config.num_heads,
                                              use_bias=False)


class FeedForward(tf.keras.layers.Layer):
    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(**kwargs)
        self.inner = tf.keras.layers.Dense(config.filter_size, activation="relu")
        self.outer = tf.keras.layers.Dense(config.d_model)
        self.norm = tf.keras.layers.LayerNormalization(epsilon=1e-6)

    def call(self, x):
        return self.norm(x + self.outer(self.inner(x)))


class EncoderLayer(tf.keras.layers.Layer):
    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(**kwargs)
        self.attention = attention(config)
        self.norm = tf.keras.layers.LayerNormalization(epsilon=1e-6)
        self.ffn = FeedForward(config)

    def call(self, x):
        return self.ffn(self.norm(x + self.attention(x, x)))


class DecoderLayer(tf.keras.layers.Layer):
    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(**kwargs)
        self.self_attention = attention(config)
        self.cross_attention = attention(config)
        self.norm1 = tf.keras.layers.LayerNormalization(epsilon=1e-6)
        self.norm2 = tf.keras.layers.LayerNormalization(epsilon=1e-6)
        self.ffn = FeedForward(config)

    def call(self, x, memory):
        x = self.norm1(x + self.self_attention(x, x, use_causal_mask=True))
        x = self.norm2(x + self.cross_attention(x, memory))
        return self.ffn(x)


class Transformer(tf.keras.Model):
    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(**kwargs)
        self.config = config
        self.scale = math.sqrt(config.d_model)
        self.positions = positional_encoding(config.seq_len, config.d_model)
        width = config.embedding_width
        self.source_embedding = tf.keras.layers.Embedding(config.vocab_size, width, name="source_embedding")
        self.target_embedding = tf.keras.layers.Embedding(config.vocab_size, width, name="target_embedding")
        factorised = width != config.d_model
        self.source_projection = tf.keras.layers.Dense(config.d_model, use_bias=False) if factorised else None
        self.target_projection = tf.keras.layers.Dense(config.d_model, use_bias=False) if factorised else None
        self.encoder = [EncoderLayer(config, name=f"encoder_{i}") for i in range(config.num_layers)]
        self.decoder = [DecoderLayer(config, name=f"decoder_{i}") for i in range(config.num_layers)]
        self.output_projection = (
            None if config.tie_target_embedding
            else tf.keras.layers.Dense(config.vocab_size, name="output_projection")
        )
        self.side_embedding = (
            tf.keras.layers.Embedding(config.side_vocab_size, config.side_embedding_size or width,
                                      name="side_embedding")
            if config.side_vocab_size else None
        )
        self.side_projection = (
            tf.keras.layers.Dense(config.d_model, use_bias=False)
            if config.side_vocab_size and (config.side_embedding_size or width) != config.d_model else None
        )

    def call(self, inputs):
        source, target, side = inputs
        x = self.source_embedding(source)
        if self.source_projection is not None:
            x = self.source_projection(x)
        x = x * self.scale + self.positions
        if self.side_embedding is not None:
            # Side features (e.g. a user or document id table) added to the first source position.
            features = tf.reduce_mean(self.side_embedding(side), axis=1, keepdims=True)
            if self.side_projection is not None:
                features = self.side_projection(features)
            x = x + tf.pad(features, [[0, 0], [0, self.config.seq_len - 1], [0, 0]])
        for layer in self.encoder:
            x = layer(x)
        y = self.target_embedding(target)
        if self.target_projection is not None:
            y = self.target_projection(y)
        y = y * self.scale + self.positions
        for layer in self.decoder:
            y = layer(y, x)
        if self.output_projection is not None:
            return self.output_projection(y)
        # 2-D matmul: a batched one would give the tied matrix a [batch, vocab, d_model] gradient.
        flat = tf.reshape(y, [-1, self.config.d_model])
        logits = tf.matmul(flat, self.target_embedding.embeddings, transpose_b=True)
        return tf.reshape(logits, [-1, self.config.seq_len, self.config.vocab_size])


class WarmupSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):
    """The Transformer's schedule: linear warm-up, then inverse square root decay."""

    def __init__(self, d_model: int, warmup_steps: int):
        self.d_model = float(d_model)
        self.warmup_steps = float(warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        return self.d_model**-0.5 * tf.minimum(step**-0.5, step * self.warmup_steps**-1.5)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps}


class Batches:
    """Synthetic parallel batches: Zipf-distributed source and target ids, a pure function of step."""

    def __init__(self, config: TransformerConfig, seed: int, rank: int):
        self.config, self.seed, self.rank = config, seed, rank
        self.tokens = ZipfTokens(config.vocab_size, config.zipf_exponent)
        self.side = ZipfTokens(config.side_vocab_size, config.side_zipf_exponent) if config.side_vocab_size else None

    def __call__(self, step: int):
        c = self.config
        rng = batch_rng(self.seed, self.rank, step)
        source = self.tokens.sample(rng, (c.batch_size, c.seq_len))
        target = self.tokens.sample(rng, (c.batch_size, c.seq_len + 1))
        lookups = max(1, c.side_lookups_per_rank // c.batch_size)
        side = (self.side.sample(rng, (c.batch_size, lookups)) if self.side is not None
                else np.zeros((c.batch_size, 1), np.int32))
        return source, target[:, :-1], target[:, 1:], side


def run(ctx: WorkloadContext, workload: str = "transformer") -> None:
    config = with_overrides(PRESETS[workload][ctx.preset], ctx.overrides)
    if ctx.engine == TF_DISTRIBUTE:
        _run_strategy(ctx, config)
    else:
        _run_horovod(ctx, config)


def _optimizer(config: TransformerConfig) -> tf.keras.optimizers.Optimizer:
    return tf.keras.optimizers.Adam(WarmupSchedule(config.d_model, config.warmup_steps),
                                    beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def _run_horovod(ctx: WorkloadContext, config: TransformerConfig) -> None:
    import horovod.tensorflow as hvd

    tf.keras.utils.set_random_seed(ctx.seed)  # same initial parameters on every rank
    model = Transformer(config)
    optimizer = _optimizer(config)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    batches = Batches(config, ctx.seed, ctx.rank)
    source, target_in, _, side = batches(0)
    model((source, target_in, side))
    optimizer.build(model.trainable_variables)  # slots made here, not in a second trace
    if ctx.decide_lookups is not None:
        # The tables whose gradients are IndexedSlices of one row per looked-up id (a tied target
        # table's is dense), decided from the first batch before the step is traced.
        tables = [(model.source_embedding.embeddings, source)]
        if not config.tie_target_embedding:
            tables.append((model.target_embedding.embeddings, target_in))
        if model.side_embedding is not None:
            tables.append((model.side_embedding.embeddings, side))
        ctx.decide_lookups(tables)

    # One trace, without autograph (the step has no data-dependent Python control flow): step 0
    # traces the graph, and that was most of a short run's time.
    @tf.function(autograph=False)
    def train_step(source, target_in, target_out, side):
        with tf.GradientTape() as tape:
            logits = model((source, target_in, side), training=True)
            loss = loss_fn(target_out, logits)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def step(k: int) -> float:
        return train_step(*batches(k)).numpy()

    train(
        ctx,
        variables=lambda: model.trainable_variables,
        train_step=step,
        broadcast=lambda: hvd.broadcast_variables(model.variables, root_rank=0),
        items_per_step=config.tokens_per_rank,
    )


def _run_strategy(ctx: WorkloadContext, config: TransformerConfig) -> None:
    """The same training under tf.distribute.MultiWorkerMirroredStrategy (TF_CONFIG written by the
    agent): model and optimizer built in the strategy's scope, which broadcasts worker 0's initial
    values as it creates each variable; each step runs the replica step on this worker's own batch,
    and ``apply_gradients`` sums the gradients over the workers through the strategy. The policy
    (``--mode``) is applied where the strategy reduces them (memdiag.agent.hooks_tf); in ``auto`` it
    decides when the step is traced, from every worker's rows, so nothing is decided here."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.keras.utils.set_random_seed(ctx.seed)  # the same initial values as the Horovod variant
    batches = Batches(config, ctx.seed, ctx.rank)
    source, target_in, _, side = batches(0)
    with strategy.scope():
        model = Transformer(config)
        optimizer = _optimizer(config)
        model((source, target_in, side))
        optimizer.build(model.trainable_variables)  # slots made here, not in a second trace
    # Keras 2 refuses a loss reduced over the batch inside a strategy's replica: per token here,
    # averaged in the replica step.
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    workers = strategy.num_replicas_in_sync

    def replica_step(source, target_in, target_out, side):
        with tf.GradientTape() as tape:
            logits = model((source, target_in, side), training=True)
            loss = tf.reduce_mean(loss_fn(target_out, logits))  # this worker's mean, as Horovod's variant
            # MWMS sums the workers' gradients where Horovod averages them: each worker's mean is
            # divided by the number of workers (the global batch's mean, as tf.nn.compute_average_loss
            # scales a loss), so that the summed gradient is Horovod's average and both engines train
            # the same model (at 2 workers bitwise: halving is exact; docs/explanation/correctness.md).
            scaled = loss / workers
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # One trace, without autograph, as the Horovod variant. The loss returned is this worker's own
    # (the strategy's local result, no collective), as Horovod's variant records it.
    @tf.function(autograph=False)
    def train_step(source, target_in, target_out, side):
        losses = strategy.run(replica_step, args=(source, target_in, target_out, side))
        return strategy.experimental_local_results(losses)[0]

    def step(k: int) -> float:
        return train_step(*batches(k)).numpy()

    train(
        ctx,
        variables=lambda: model.trainable_variables,
        train_step=step,
        broadcast=None,
        items_per_step=config.tokens_per_rank,
    )
