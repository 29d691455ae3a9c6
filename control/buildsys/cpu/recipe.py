"""Sizes and schedules of the CPU pair: the full build (demo, benchmarks) and the quick build (CI).

Compute budget of the full build: the 2-core CI machine does roughly 120 GFLOP/s fp32 peak and
about 60-90 GFLOP/s in bf16-autocast training steps, so 30 minutes buy about 1e14 training FLOPs.
At ~6 x 19M non-embedding parameters x tokens that is about 1.3M target tokens; the drafts are
distilled from the target's own greedy outputs, which costs little more than generating them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from control.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """A Llama shape; ``name`` is also the model's subdirectory under the engine directory."""

    name: str
    hidden: int
    layers: int
    heads: int
    ffn: int
    kv_heads: int | None = None
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.hidden % self.heads:
            raise ConfigError(f"model '{self.name}': hidden {self.hidden} is not divisible by heads {self.heads}")


@dataclass(frozen=True)
class TrainSpec:
    steps: int
    batch: int  # sequences per step
    seq: int  # tokens per sequence
    lr: float
    warmup: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1


@dataclass(frozen=True)
class DistillSpec:
    """Distillation of the drafts from the target's greedy continuations of training prompts."""

    sequences: int  # prompts the target continues
    prompt: int  # prompt tokens
    generate: int  # greedy tokens the target adds
    gen_batch: int  # prompts generated together
    topk: int  # teacher probabilities kept per position (soft labels)
    train: TrainSpec


@dataclass(frozen=True)
class EvalSpec:
    prompts: int  # held-out prompts
    prompt: int  # tokens per prompt
    generate: int  # greedy target tokens per prompt along which acceptance is measured


@dataclass(frozen=True)
class PairRecipe:
    name: str
    vocab: int
    max_position: int
    target: ModelSpec
    drafts: tuple[ModelSpec, ...]
    target_train: TrainSpec
    distill: DistillSpec
    eval: EvalSpec
    max_train_bytes: int | None = None
    max_heldout_files: int | None = None
    bf16_autocast: bool = True
    quick: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


FULL = PairRecipe(
    name="stdlib-full",
    vocab=4096,
    max_position=2048,
    target=ModelSpec("target", hidden=512, layers=6, heads=8, ffn=1408),
    drafts=(
        ModelSpec("draft-small", hidden=192, layers=2, heads=4, ffn=512, tie_embeddings=True),
        ModelSpec("draft-tiny", hidden=96, layers=1, heads=2, ffn=256, tie_embeddings=True),
    ),
    target_train=TrainSpec(steps=300, batch=16, seq=256, lr=2e-3, warmup=30),
    distill=DistillSpec(sequences=1536, prompt=32, generate=96, gen_batch=64, topk=16,
                        train=TrainSpec(steps=400, batch=32, seq=128, lr=3e-3, warmup=20, weight_decay=0.0)),
    eval=EvalSpec(prompts=48, prompt=128, generate=64),
    max_train_bytes=12_000_000,
)

QUICK = PairRecipe(
    name="stdlib-quick",
    vocab=512,
    max_position=1024,
    target=ModelSpec("target", hidden=128, layers=2, heads=4, ffn=384),
    drafts=(
        ModelSpec("draft-small", hidden=48, layers=1, heads=2, ffn=128, tie_embeddings=True),
        ModelSpec("draft-tiny", hidden=32, layers=1, heads=2, ffn=64, tie_embeddings=True),
    ),
    target_train=TrainSpec(steps=120, batch=8, seq=128, lr=3e-3, warmup=10),
    distill=DistillSpec(sequences=64, prompt=16, generate=48, gen_batch=32, topk=8,
                        train=TrainSpec(steps=80, batch=16, seq=64, lr=5e-3, warmup=5, weight_decay=0.0)),
    eval=EvalSpec(prompts=8, prompt=32, generate=32),
    max_train_bytes=1_500_000,
    max_heldout_files=16,
    quick=True,
)

RECIPES = {"full": FULL, "quick": QUICK}


def get_recipe(name: str) -> PairRecipe:
    if name not in RECIPES:
        raise ConfigError(f"unknown CPU pair recipe '{name}'; known: {', '.join(RECIPES)}")
    return RECIPES[name]
