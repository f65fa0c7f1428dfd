"""Presets of the built-in workloads: plain data, importable without TensorFlow."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class TransformerConfig:
    """Encoder-decoder Transformer for translation (the reference NMT workload's shape)."""

    vocab_size: int = 33945
    d_model: int = 512
    num_layers: int = 6
    num_heads: int = 8
    filter_size: int = 2048
    seq_len: int = 50
    tokens_per_rank: int = 5000
    # Tying the target embedding to the output softmax makes TF sum a dense and an IndexedSlices
    # gradient into a dense one; the source embedding stays an IndexedSlices gradient.
    tie_target_embedding: bool = True
    # Width of the embedding rows when it differs from d_model (a factorised embedding projected to
    # d_model, as in ALBERT); 0 means d_model. Wide rows make the gathered bytes large at little compute.
    embedding_size: int = 0
    warmup_steps: int = 4000
    zipf_exponent: float = 1.1
    # A second, large and truly sparse table ("mixed" workload): rows and lookups per rank.
    side_vocab_size: int = 0
    side_lookups_per_rank: int = 0
    side_embedding_size: int = 0  # 0: the embedding width
    # The side ids' Zipf exponent: 0.5 spreads lookups over the table (few repeats); with many lookups
    # and an exponent near 1.1 most of them repeat a few rows, where merging duplicates pays.
    side_zipf_exponent: float = 0.5

    @property
    def batch_size(self) -> int:
        return max(1, self.tokens_per_rank // self.seq_len)

    @property
    def embedding_width(self) -> int:
        return self.embedding_size or self.d_model

    def check(self) -> None:
        from memdiag._errors import UserError

        if self.tie_target_embedding and self.embedding_width != self.d_model:
            raise UserError("tie_target_embedding needs embedding_size equal to d_model; "
                            "set --set tie_target_embedding=false or --set embedding_size=0")
        if self.d_model % self.num_heads:
            raise UserError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if self.tokens_per_rank < self.seq_len:
            raise UserError(f"tokens_per_rank {self.tokens_per_rank} is below seq_len {self.seq_len}")


@dataclass(frozen=True)
class ResNetConfig:
    image_size: int = 224
    num_classes: int = 1000
    batch_per_rank: int = 32
    base_learning_rate: float = 0.1  # for a global batch of 256, scaled linearly
    warmup_steps: int = 5
    label_smoothing: float = 0.1
    width: str = "standard"
    # After the warm-up: "step" (divide by 10 at 30/90, 60/90, 80/90 of the run) or "cosine".
    decay: str = "step"

    def check(self) -> None:
        from memdiag._errors import UserError

        if self.decay not in ("step", "cosine"):
            raise UserError(f"decay {self.decay!r}: choose step or cosine")
        if self.width != "standard":
            raise UserError(f"width {self.width!r}: only the standard ResNet-50 width exists")
        if self.image_size < 32 or self.batch_per_rank < 1 or self.num_classes < 2:
            raise UserError("image_size must be >= 32, batch_per_rank >= 1 and num_classes >= 2")


PRESETS: dict[str, dict[str, Any]] = {
    "transformer": {
        "tiny": TransformerConfig(vocab_size=512, d_model=32, num_layers=1, num_heads=2, filter_size=64,
                                  seq_len=16, tokens_per_rank=256, warmup_steps=100),
        # The default of comparisons on a 2-core machine: embedding rows as wide as the reference
        # "big" model's (1024 floats), 8192 tokens per rank, and a narrow model behind a projection
        # so that a step costs little compute. Both embeddings give IndexedSlices gradients. A 2048-word
        # vocabulary keeps the output logits (tokens x vocab floats) small, so that from N=2 on the
        # gathered buffers, not the activations, set the peak.
        "small": TransformerConfig(vocab_size=2048, d_model=64, num_layers=1, num_heads=2,
                                   filter_size=256, seq_len=64, tokens_per_rank=8192,
                                   tie_target_embedding=False, embedding_size=1024, warmup_steps=400),
        "base": TransformerConfig(),
        "big": TransformerConfig(d_model=1024, num_heads=16, filter_size=4096),
    },
    "mixed": {
        "tiny": TransformerConfig(vocab_size=512, d_model=32, num_layers=1, num_heads=2, filter_size=64,
                                  seq_len=16, tokens_per_rank=512, warmup_steps=100,
                                  side_vocab_size=20000, side_lookups_per_rank=64),
        # Word tables that auto should densify (wide rows, many tokens, small vocabulary) beside a
        # 300,000-row side table with 256 lookups per rank that it should keep sparse.
        "small": TransformerConfig(vocab_size=2048, d_model=64, num_layers=1, num_heads=2,
                                   filter_size=256, seq_len=64, tokens_per_rank=8192,
                                   tie_target_embedding=False, embedding_size=1024, warmup_steps=400,
                                   side_vocab_size=300000, side_lookups_per_rank=256, side_embedding_size=128),
    },
    "resnet50": {
        "tiny": ResNetConfig(image_size=32, num_classes=10, batch_per_rank=4),
        "paper": ResNetConfig(),
    },
}


# The words a boolean setting accepts (case-insensitive). Anything else is refused: a typo such as
# "flase" must not quietly become False and change the workload.
BOOLEAN_WORDS: dict[str, bool] = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def parse_bool(key: str, text: str) -> bool:
    """``--set KEY=TEXT`` for a boolean setting: one of :data:`BOOLEAN_WORDS`, or a UserError."""
    from memdiag._errors import UserError

    try:
        return BOOLEAN_WORDS[text.strip().lower()]
    except KeyError:
        raise UserError(f"--set {key}={text}: {key} is true or false; write --set {key}=true or "
                        f"--set {key}=false (yes/no and 1/0 work too)") from None


def with_overrides(config: Any, overrides: dict[str, str]) -> Any:
    """Apply ``--set key=value`` overrides, converting each value to the field's type."""
    from memdiag._errors import UserError

    known = {f.name: f for f in fields(config)}
    changes: dict[str, Any] = {}
    for key, text in overrides.items():
        if key not in known:
            raise UserError(f"--set {key}: unknown setting; known: {', '.join(sorted(known))}")
        kind = type(getattr(config, key))
        if kind is bool:
            changes[key] = parse_bool(key, text)
            continue
        try:
            changes[key] = kind(text)
        except ValueError:
            raise UserError(f"--set {key}={text}: expected a {kind.__name__}") from None
    config = replace(config, **changes)
    if hasattr(config, "check"):
        config.check()
    return config
