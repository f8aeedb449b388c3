"""`QwenConfig`: the frozen description of a Qwen2/2.5 or Qwen3 decoder, with presets and HF `config.json` I/O.

One decoder serves both families (DESIGN.md, models); they differ in three flags:

==========  ==========  ========  ==================================================
family      qkv_bias    qk_norm   notes
==========  ==========  ========  ==================================================
Qwen2/2.5   True        False     q/k/v projections carry a bias, o_proj does not
Qwen3       False       True      per-head RMSNorm on q and k (over H) before RoPE
==========  ==========  ========  ==================================================

Presets are classmethods (STYLE.md 9). The published sizes are written out from the checkpoints' own
``config.json`` files; :meth:`QwenConfig.check_against` compares a preset with a checkpoint folder and names every
field that differs, and :meth:`QwenConfig.from_hf` reads one directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class QwenConfig:
    """Architecture and numerics of one decoder.

    Attributes:
      vocab_size: V, rows of the embedding (and of the LM head).
      d_model: D, the residual width (HF ``hidden_size``).
      mlp_dim: F, the SwiGLU width (HF ``intermediate_size``).
      num_layers: decoder blocks.
      num_heads: N query heads.
      num_kv_heads: K key/value heads (GQA: N is a multiple of K).
      head_dim: H.
      rope_theta: RoPE base θ from the checkpoint (1e6 for Qwen2.5, 5e6 for Qwen3-2507).
      rms_eps: ε of every RMSNorm.
      tie_embeddings: the LM head is the embedding matrix (small sizes).
      qkv_bias: Qwen2 biases on the q/k/v projections.
      qk_norm: Qwen3 per-head RMSNorm of q and k.
      max_positions: the checkpoint's ``max_position_embeddings`` (informational; RoPE has no table).
      param_dtype: storage dtype of the parameters ("float32" or "bfloat16").
      dtype: activation / matmul dtype. Norms, the softmax and log-probs are always computed in float32.
      remat: wrap each block in ``nnx.remat`` (recompute activations in the backward pass).
      attention_chunk: queries per block of the no-cache attention (training forwards, prefill); 0: by backend,
        64 on the CPU, 256 on accelerators (:func:`agentjax.models.qwen.causal_attention`).
      attention_unroll: at most this many query blocks are unrolled, each scoring only the keys up to its end
        (half the scores of a square); a longer sequence loops over blocks of one shape in a ``lax.map`` that
        scores every key, masked, so the compiled program does not grow with the sequence. 0: by backend, 128 on
        the CPU (unrolled up to 8,192 tokens: on a CPU the triangle is faster, 2.3x per step at 2,048 tokens, and
        compiles are cached), 1 on accelerators (an H200 compile of the 1.5B training step at 2,048 tokens, 32
        unrolled blocks a layer, did not finish in 200 s).
      name: the preset's name, for logs.
    """

    vocab_size: int
    d_model: int
    mlp_dim: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = True
    qkv_bias: bool = True
    qk_norm: bool = False
    max_positions: int = 32768
    param_dtype: str = "float32"
    dtype: str = "float32"
    remat: bool = False
    attention_chunk: int = 0
    attention_unroll: int = 0
    name: str = "custom"

    def __post_init__(self):
        for field in ("vocab_size", "d_model", "mlp_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if getattr(self, field) <= 0:
                raise ValueError(f"QwenConfig.{field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads} (GQA groups)"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        for field in ("attention_chunk", "attention_unroll"):
            if getattr(self, field) < 0:
                raise ValueError(f"QwenConfig.{field} must be >= 0 (0: chosen by backend), got {getattr(self, field)}")
        for field in ("param_dtype", "dtype"):
            if getattr(self, field) not in _DTYPES:
                raise ValueError(f"QwenConfig.{field}={getattr(self, field)!r}; choose one of {sorted(_DTYPES)}")

    # -- derived --------------------------------------------------------------------------------------------------
    @property
    def jnp_param_dtype(self):
        return _DTYPES[self.param_dtype]

    @property
    def jnp_dtype(self):
        return _DTYPES[self.dtype]

    @property
    def family(self) -> str:
        return "qwen3" if self.qk_norm else "qwen2"

    def replace(self, **changes: Any) -> QwenConfig:
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count (embedding counted once when tied)."""
        d, f, n, k, h = self.d_model, self.mlp_dim, self.num_heads, self.num_kv_heads, self.head_dim
        attn = d * n * h + 2 * d * k * h + n * h * d
        if self.qkv_bias:
            attn += n * h + 2 * k * h
        if self.qk_norm:
            attn += 2 * h
        block = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_embeddings else self.vocab_size * d
        return self.vocab_size * d + self.num_layers * block + d + head

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token (forward + backward = 3 × forward), matmuls only, with causal attention."""
        d, f, n, k, h = self.d_model, self.mlp_dim, self.num_heads, self.num_kv_heads, self.head_dim
        dense = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f
        attn = n * h * seq_len  # QK^T and AV, halved by the causal mask: 2 * (N H L) / 2 multiply-adds
        forward = 2 * (self.num_layers * (dense + attn) + d * self.vocab_size)
        return 3.0 * forward

    # -- presets (values from each checkpoint's config.json) --------------------------------------------------------
    @classmethod
    def qwen2p5_0p5b(cls, **kw) -> QwenConfig:
        return cls(**(dict(vocab_size=151936, d_model=896, mlp_dim=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                   head_dim=64, tie_embeddings=True, name="qwen2.5-0.5b") | kw))

    @classmethod
    def qwen2p5_1p5b(cls, **kw) -> QwenConfig:
        return cls(**(dict(vocab_size=151936, d_model=1536, mlp_dim=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                   head_dim=128, tie_embeddings=True, name="qwen2.5-1.5b") | kw))

    @classmethod
    def qwen2p5_3b(cls, **kw) -> QwenConfig:
        return cls(**(dict(vocab_size=151936, d_model=2048, mlp_dim=11008, num_layers=36, num_heads=16, num_kv_heads=2,
                   head_dim=128, tie_embeddings=True, name="qwen2.5-3b") | kw))

    @classmethod
    def qwen2p5_7b(cls, **kw) -> QwenConfig:
        return cls(**(dict(vocab_size=152064, d_model=3584, mlp_dim=18944, num_layers=28, num_heads=28, num_kv_heads=4,
                   head_dim=128, tie_embeddings=False, name="qwen2.5-7b") | kw))

    @classmethod
    def qwen3_4b(cls, **kw) -> QwenConfig:
        """Qwen3-4B-Instruct-2507 (θ = 5e6, 262,144 positions)."""
        return cls(**(dict(vocab_size=151936, d_model=2560, mlp_dim=9728, num_layers=36, num_heads=32, num_kv_heads=8,
                   head_dim=128, rope_theta=5_000_000.0, max_positions=262144, tie_embeddings=True,
                   qkv_bias=False, qk_norm=True, name="qwen3-4b") | kw))

    @classmethod
    def tiny_qwen2(cls, **kw) -> QwenConfig:
        """A test size with Qwen2.5's structure (GQA 4:2, q/k/v bias, tied embeddings)."""
        kw = dict(vocab_size=512, d_model=64, mlp_dim=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                  rope_theta=10_000.0, max_positions=2048, name="tiny-qwen2") | kw
        return cls(**kw)

    @classmethod
    def tiny_qwen3(cls, **kw) -> QwenConfig:
        """A test size with Qwen3's structure (q/k norm, no bias, untied head)."""
        kw = dict(vocab_size=512, d_model=64, mlp_dim=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                  rope_theta=1_000_000.0, max_positions=2048, tie_embeddings=False, qkv_bias=False, qk_norm=True,
                  name="tiny-qwen3") | kw
        return cls(**kw)

    @classmethod
    def preset(cls, name: str, **kw) -> QwenConfig:
        """A preset by its name (``qwen2.5-1.5b``, ``qwen3-4b``, ``tiny-qwen2``, ...)."""
        presets = {
            "qwen2.5-0.5b": cls.qwen2p5_0p5b, "qwen2.5-1.5b": cls.qwen2p5_1p5b, "qwen2.5-3b": cls.qwen2p5_3b,
            "qwen2.5-7b": cls.qwen2p5_7b, "qwen3-4b": cls.qwen3_4b, "tiny-qwen2": cls.tiny_qwen2,
            "tiny-qwen3": cls.tiny_qwen3,
        }
        if name not in presets:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(presets)}")
        return presets[name](**kw)

    # -- Hugging Face config.json -----------------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, source: str | os.PathLike | dict, **kw) -> QwenConfig:
        """Reads a ``config.json`` (a folder, the file, or its parsed dict) of ``model_type`` qwen2 or qwen3.

        RoPE θ is read from ``rope_theta`` (the published checkpoints) or ``rope_parameters`` (transformers 5).
        Sliding-window attention and RoPE scaling are not part of the published Qwen2.5/Qwen3 instruct configs and
        are rejected rather than silently ignored.
        """
        hf = _read_hf_config(source)
        model_type = hf.get("model_type")
        if model_type not in ("qwen2", "qwen3"):
            raise ValueError(f"config.json has model_type={model_type!r}; agentjax loads 'qwen2' and 'qwen3'")
        if hf.get("use_sliding_window"):
            raise ValueError("config.json sets use_sliding_window=true; sliding-window attention is not supported")
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type not in (None, "default"):
            raise ValueError(f"config.json uses rope_type={rope_type!r}; only the default RoPE is supported")
        theta = rope.get("rope_theta", hf.get("rope_theta", 10_000.0))
        qwen3 = model_type == "qwen3"
        heads = hf["num_attention_heads"]
        fields = dict(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], mlp_dim=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"], num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=float(theta),
            rms_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=bool(hf.get("attention_bias", False)) if qwen3 else True, qk_norm=qwen3,
            max_positions=hf.get("max_position_embeddings", 32768), name=hf.get("_name_or_path") or model_type,
        )
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json has hidden_act={hf['hidden_act']!r}; Qwen uses 'silu'")
        return cls(**(fields | kw))

    def to_hf(self) -> dict:
        """The ``config.json`` dict that transformers (and vLLM) read for this architecture."""
        qwen3 = self.qk_norm
        out = {
            "architectures": ["Qwen3ForCausalLM" if qwen3 else "Qwen2ForCausalLM"],
            "model_type": "qwen3" if qwen3 else "qwen2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.d_model,
            "intermediate_size": self.mlp_dim,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_positions,
            "rms_norm_eps": self.rms_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "tie_word_embeddings": self.tie_embeddings,
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "torch_dtype": self.param_dtype,
            "dtype": self.param_dtype,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
        }
        if qwen3:
            out["attention_bias"] = self.qkv_bias
        elif not self.qkv_bias:
            raise ValueError("Qwen2 checkpoints always carry q/k/v biases; qkv_bias=False has no HF Qwen2 layout")
        return out

    def check_against(self, source: str | os.PathLike | dict) -> None:
        """Raises ``ValueError`` naming every architecture field where this preset and a checkpoint disagree."""
        other = QwenConfig.from_hf(source)
        arch = ("vocab_size", "d_model", "mlp_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                "rope_theta", "rms_eps", "tie_embeddings", "qkv_bias", "qk_norm")
        diff = [f"{f}: preset {getattr(self, f)!r} vs checkpoint {getattr(other, f)!r}"
                for f in arch if getattr(self, f) != getattr(other, f)]
        if diff:
            raise ValueError(f"preset {self.name!r} does not match the checkpoint's config.json: " + "; ".join(diff))


def _read_hf_config(source: str | os.PathLike | dict) -> dict:
    if isinstance(source, dict):
        return source
    path = pathlib.Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"no config.json at {path}: point at a Hugging Face checkpoint folder")
    return json.loads(path.read_text())
