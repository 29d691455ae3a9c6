"""What the profiler times: the models of an engine directory, or random-weight models of catalog
shapes (``--shape NAME --random-weights``: timing only, for GPU hosts without checkpoints)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from control.buildsys.catalog import ModelShape, get_model
from control.errors import ConfigError, MissingDependencyError
from control.executors.reference.model import LlamaConfig, LlamaForCausalLM, load_pretrained, rope_inv_freq

# Drafts profiled with a target shape when --draft-shape is not given.
DEFAULT_DRAFT_SHAPES = {
    "llama-3.1-8b": ("llama-3.2-1b", "llama-160m"),
    "llama-3.1-70b": ("llama-3.1-8b", "llama-3.2-1b"),
    "llama-2-7b": ("llama-160m", "llama-68m"),
    "tinyllama-1.1b": ("llama-160m", "llama-68m"),
}


@dataclass
class ProfiledModel:
    key: str  # name in the profile's ``models``
    role: str  # target | draft
    model: LlamaForCausalLM
    source: str  # subdirectory or shape name

    def __post_init__(self) -> None:
        # Time each model in the mode the reference executor runs it: where the model has a
        # batch-invariant forward, the target uses it (lossless greedy verification) and drafts,
        # which only propose, do not.
        if hasattr(self.model, "batch_invariant"):
            self.model.batch_invariant = self.role == "target"

    @property
    def params(self) -> int:
        return self.model.num_parameters()


def resolve_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise MissingDependencyError(
                f"--device {name}: torch {torch.__version__} sees no CUDA device on this machine; use --device cpu"
            )
        return torch.device(name)
    raise ConfigError(f"--device {name!r} is not supported; use cpu or cuda (cuda:N)")


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def shape_config(shape: ModelShape) -> LlamaConfig:
    if shape.kind != "llama":
        raise ConfigError(f"shape '{shape.name}' is a {shape.kind}, not a Llama decoder; the reference executor "
                          "profiles Llama shapes (target or draft)")
    return LlamaConfig(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_position, rope_theta=shape.rope_theta,
        tie_word_embeddings=shape.tied_embeddings,
    )


def random_model(shape_name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LlamaForCausalLM:
    """A Llama of the catalog shape with N(0, 0.02) weights, allocated directly on ``device`` in ``dtype``."""
    cfg = shape_config(get_model(shape_name))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to(dtype).to_empty(device=device)  # cast on meta first: allocate once, in dtype
    if cfg.tie_word_embeddings:  # to_empty gives the shared weight two storages: tie them again
        model.lm_head.weight = model.model.embed_tokens.weight
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    model.inv_freq = rope_inv_freq(cfg).float().to(device)  # a non-persistent buffer: to_empty left it empty
    return model.requires_grad_(False).eval()


def engine_models(engine_dir: str | Path, device: torch.device, dtype: torch.dtype):
    """(manifest, [target, drafts...]) of an engine directory."""
    from control.executors.manifest import load_manifest

    d = Path(engine_dir)
    manifest = load_manifest(d)
    out = [ProfiledModel("target", "target", load_pretrained(d / manifest.target, device=device, dtype=dtype),
                         manifest.target)]
    for spec in manifest.drafters:
        if spec.kind == "draft_model":
            out.append(ProfiledModel(spec.name, "draft", load_pretrained(d / spec.model, device=device, dtype=dtype),
                                     spec.model))
    return manifest, out


def shape_models(target: str, drafts: tuple[str, ...] | None, device: torch.device, dtype: torch.dtype):
    names = drafts if drafts is not None else DEFAULT_DRAFT_SHAPES.get(get_model(target).name, ())
    if len(set(names)) != len(names):
        raise ConfigError(f"--draft-shape given twice: {', '.join(names)}; name each draft shape once")
    for n in (target, *names):
        get_model(n)  # every unknown name fails before anything is allocated
    out = [ProfiledModel("target", "target", random_model(target, device, dtype), target)]
    for i, n in enumerate(names):
        out.append(ProfiledModel(n, "draft", random_model(n, device, dtype, seed=i + 1), n))
    return out
