"""Hugging Face checkpoints in and out: safetensors (single file or sharded with an index) ⇄ a :class:`Qwen`.

Loading reads every tensor through a memory map and hands it to ``jax.make_array_from_callback``, so each device
(each host, on several) reads only its own shard of each parameter: a checkpoint goes straight into sharded arrays,
never through one full host copy per device. Saving writes the HF layout (``model.safetensors`` or
``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``) and ``config.json``, which transformers and
vLLM load as they are.

Name map (HF → agentjax; ``W`` in HF is ``[out, in]``)::

    model.embed_tokens.weight                [V, D]    embed_vd
    model.layers.i.input_layernorm.weight    [D]       blocks[i].attn_norm_d
    model.layers.i.self_attn.q_proj.weight   [N·H, D]  blocks[i].attn.q_dnh   (reshape N, H, D; transpose 2, 0, 1)
    model.layers.i.self_attn.k_proj.weight   [K·H, D]  blocks[i].attn.k_dkh   (likewise; v_proj likewise)
    model.layers.i.self_attn.{q,k,v}_proj.bias          blocks[i].attn.{q_bias_nh, k_bias_kh, v_bias_kh}
    model.layers.i.self_attn.o_proj.weight   [D, N·H]  blocks[i].attn.o_nhd   (reshape D, N, H; transpose 1, 2, 0)
    model.layers.i.self_attn.{q,k}_norm.weight [H]     blocks[i].attn.{q_norm_h, k_norm_h}   (Qwen3)
    model.layers.i.post_attention_layernorm.weight      blocks[i].mlp_norm_d
    model.layers.i.mlp.{gate,up}_proj.weight [F, D]    blocks[i].mlp.{gate_df, up_df}  (transpose)
    model.layers.i.mlp.down_proj.weight      [D, F]    blocks[i].mlp.down_fd  (transpose)
    model.norm.weight                        [D]       final_norm_d
    lm_head.weight                           [V, D]    unembed_vd (untied; absent or equal to the embedding when tied)
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import struct as _struct
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import safetensors.numpy
from flax import nnx
from jax.experimental import multihost_utils

from agentjax.models.config import QwenConfig
from agentjax.models.qwen import ActivationSharding, Qwen

SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}


# -- the name and layout map ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Entry:
    path: tuple  # the parameter's path in the nnx.State
    hf_name: str
    to_ours: Callable[[np.ndarray], np.ndarray]  # HF layout -> agentjax layout (views where possible)
    to_hf: Callable[[np.ndarray], np.ndarray]
    hf_shape: tuple[int, ...]  # the tensor's shape in the checkpoint


def _entries(cfg: QwenConfig) -> list[_Entry]:
    d, n, k, h = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    ident = lambda a: a
    transpose = lambda a: a.T

    def proj_in(heads):  # [heads*H, D] <-> [D, heads, H]
        return (lambda a: a.reshape(heads, h, d).transpose(2, 0, 1),
                lambda a: a.transpose(1, 2, 0).reshape(heads * h, d))

    def bias(heads):  # [heads*H] <-> [heads, H]
        return lambda a: a.reshape(heads, h), lambda a: a.reshape(heads * h)

    v, f = cfg.vocab_size, cfg.mlp_dim
    out = [_Entry(("embed_vd",), "model.embed_tokens.weight", ident, ident, (v, d)),
           _Entry(("final_norm_d",), "model.norm.weight", ident, ident, (d,))]
    if not cfg.tie_embeddings:
        out.append(_Entry(("unembed_vd",), "lm_head.weight", ident, ident, (v, d)))
    o_in = (lambda a: a.reshape(d, n, h).transpose(1, 2, 0), lambda a: a.transpose(2, 0, 1).reshape(d, n * h))
    for i in range(cfg.num_layers):
        hf, ours = f"model.layers.{i}.", ("blocks", i)
        layer = [
            (("attn_norm_d",), "input_layernorm.weight", (ident, ident), (d,)),
            (("mlp_norm_d",), "post_attention_layernorm.weight", (ident, ident), (d,)),
            (("attn", "q_dnh"), "self_attn.q_proj.weight", proj_in(n), (n * h, d)),
            (("attn", "k_dkh"), "self_attn.k_proj.weight", proj_in(k), (k * h, d)),
            (("attn", "v_dkh"), "self_attn.v_proj.weight", proj_in(k), (k * h, d)),
            (("attn", "o_nhd"), "self_attn.o_proj.weight", o_in, (d, n * h)),
            (("mlp", "gate_df"), "mlp.gate_proj.weight", (transpose, transpose), (f, d)),
            (("mlp", "up_df"), "mlp.up_proj.weight", (transpose, transpose), (f, d)),
            (("mlp", "down_fd"), "mlp.down_proj.weight", (transpose, transpose), (d, f)),
        ]
        if cfg.qkv_bias:
            layer += [(("attn", "q_bias_nh"), "self_attn.q_proj.bias", bias(n), (n * h,)),
                      (("attn", "k_bias_kh"), "self_attn.k_proj.bias", bias(k), (k * h,)),
                      (("attn", "v_bias_kh"), "self_attn.v_proj.bias", bias(k), (k * h,))]
        if cfg.qk_norm:
            layer += [(("attn", "q_norm_h"), "self_attn.q_norm.weight", (ident, ident), (h,)),
                      (("attn", "k_norm_h"), "self_attn.k_norm.weight", (ident, ident), (h,))]
        out += [_Entry(ours + p, hf + name, *fns, shape) for p, name, fns, shape in layer]
    return out


# -- reading safetensors --------------------------------------------------------------------------------------------
def _read_header(path: pathlib.Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        (size,) = _struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


class SafetensorsIndex:
    """Lazy, memory-mapped view of the tensors of a checkpoint folder (one file or an index of shards).

    safetensors' own ``safe_open(framework="numpy")`` has no bfloat16, so the documented file layout (an 8-byte
    header length, a JSON header, raw little-endian bytes) is mapped directly with ``numpy.memmap``.
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = pathlib.Path(folder)
        index = self.folder / "model.safetensors.index.json"
        single = self.folder / "model.safetensors"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif single.exists():
            files = ["model.safetensors"]
        else:
            raise FileNotFoundError(
                f"no model.safetensors or model.safetensors.index.json in {self.folder}: point at a Hugging Face "
                "checkpoint folder (save one with save_pretrained(..., safe_serialization=True))")
        self._where: dict[str, tuple[pathlib.Path, dict, int]] = {}
        for name in files:
            path = self.folder / name
            if not path.exists():
                raise FileNotFoundError(f"the index lists {name}, which is missing from {self.folder}")
            header, start = _read_header(path)
            for key, meta in header.items():
                self._where[key] = (path, meta, start)

    def keys(self) -> list[str]:
        return sorted(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only memmap (no bytes are read until it is indexed)."""
        if name not in self._where:
            raise KeyError(f"tensor {name!r} is missing from the checkpoint in {self.folder}")
        path, meta, start = self._where[name]
        if meta["dtype"] not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {meta['dtype']}, which agentjax does not read")
        begin, end = meta["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[meta["dtype"]])
        shape = tuple(meta["shape"])
        if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise ValueError(f"tensor {name!r} in {path.name}: byte range does not match shape {shape}")
        if not shape:
            return np.fromfile(path, dtype=dtype, count=1, offset=start + begin).reshape(())
        return np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=shape)


# -- load -----------------------------------------------------------------------------------------------------------
def _leaf(state, path: tuple):
    node = state
    for key in path:
        node = node[key]
    return node


def load_hf(
    folder: str | os.PathLike,
    *,
    config: QwenConfig | None = None,
    shardings: Callable[[nnx.State], object] | None = None,
    act_sharding: ActivationSharding | None = None,
    **config_overrides,
) -> Qwen:
    """Builds a :class:`Qwen` from a Hugging Face checkpoint folder.

    Args:
      folder: holds ``config.json`` and the safetensors (single file or sharded with an index).
      config: a preset to use (checked against ``config.json`` field by field); default: read ``config.json``.
      shardings: maps the model's abstract ``nnx.State`` to a matching pytree of ``jax.sharding.Sharding``
        (e.g. ``lambda s: param_shardings(s, fsdp_tp(), mesh)``); default: every tensor on the default device.
      act_sharding: activation constraints for the built model.
      config_overrides: numerics overrides such as ``param_dtype="bfloat16"``, ``dtype=...``, ``remat=True``.

    Raises:
      KeyError naming a tensor the checkpoint lacks; ValueError naming a tensor whose shape differs, or listing
      tensors the checkpoint has that the model does not.
    """
    folder = pathlib.Path(folder)
    if config is None:
        config = QwenConfig.from_hf(folder, **config_overrides)
    else:
        config.check_against(folder)
        config = config.replace(**config_overrides)
    tensors = SafetensorsIndex(folder)

    abstract = nnx.eval_shape(lambda: Qwen(config, rngs=nnx.Rngs(0), act_sharding=act_sharding))
    graphdef, state = nnx.split(abstract)
    target = shardings(state) if shardings is not None else None
    entries = _entries(config)

    expected = {e.hf_name for e in entries}
    ignorable = {"lm_head.weight"} if config.tie_embeddings else set()
    unexpected = [k for k in tensors.keys() if k not in expected and k not in ignorable]
    if unexpected:
        raise ValueError(f"the checkpoint in {folder} has tensors the {config.family} model does not: "
                         f"{unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}")

    default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for entry in entries:
        var = _leaf(state, entry.path)
        raw = tensors.get(entry.hf_name)
        if raw.shape != entry.hf_shape:
            raise ValueError(f"tensor {entry.hf_name!r} has shape {raw.shape}; the config ({config.name}) expects "
                             f"{entry.hf_shape}")
        array = entry.to_ours(raw)
        dtype = var.dtype
        sharding = _leaf(target, entry.path) if target is not None else default
        sharding = sharding.get_value() if isinstance(sharding, nnx.Variable) else sharding
        var.set_value(jax.make_array_from_callback(
            var.shape, sharding, lambda idx, a=array, dt=dtype: np.asarray(a[idx]).astype(dt)))
    if config.tie_embeddings and "lm_head.weight" in tensors:
        embed = tensors.get("model.embed_tokens.weight")
        if not np.array_equal(tensors.get("lm_head.weight"), embed):
            raise ValueError("config ties the embeddings but lm_head.weight differs from model.embed_tokens.weight; "
                             "set tie_word_embeddings=false in config.json")
    return nnx.merge(graphdef, state)


# -- save -----------------------------------------------------------------------------------------------------------
def _host(x: jax.Array) -> np.ndarray:
    if not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(jax.device_get(x))


def hf_tensors(model: Qwen) -> Iterator[tuple[str, np.ndarray]]:
    """The model's parameters as (HF name, HF-layout host array), in checkpoint order."""
    state = nnx.state(model, nnx.Param)
    for entry in _entries(model.config):
        yield entry.hf_name, np.ascontiguousarray(entry.to_hf(_host(_leaf(state, entry.path)[...])))


def save_hf(model: Qwen, folder: str | os.PathLike, *, max_shard_bytes: int = 5 * 2**30,
            tokenizer=None) -> pathlib.Path:
    """Writes ``config.json`` and the weights in HF layout (sharded with an index past ``max_shard_bytes``).

    The files are written under temporary names and renamed at the end, so an interrupted save never leaves a
    folder that looks complete. With several processes only process 0 writes. ``tokenizer`` (a transformers
    tokenizer) is saved alongside when given.
    """
    folder = pathlib.Path(folder)
    tensors = list(hf_tensors(model))  # every process takes part in the gathers
    if jax.process_index() != 0:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[str, np.ndarray]]] = [[]]
    size = 0
    for name, array in tensors:
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, array))
        size += array.nbytes
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    written = []
    for name, shard in zip(names, shards, strict=True):
        tmp = folder / (name + ".tmp")
        safetensors.numpy.save_file(dict(shard), tmp, metadata={"format": "pt"})
        written.append((tmp, folder / name))
    if len(shards) > 1:
        weight_map = {k: name for name, shard in zip(names, shards, strict=True) for k, _ in shard}
        total = sum(a.nbytes for _, a in tensors)
        tmp = folder / "model.safetensors.index.json.tmp"
        tmp.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        written.append((tmp, folder / "model.safetensors.index.json"))
    tmp = folder / "config.json.tmp"
    tmp.write_text(json.dumps(model.config.to_hf(), indent=2))
    written.append((tmp, folder / "config.json"))
    stale = [folder / "model.safetensors"] if len(shards) > 1 else [folder / "model.safetensors.index.json"]
    for path in stale + list(folder.glob("model-*-of-*.safetensors")):
        if path not in {dst for _, dst in written}:
            path.unlink(missing_ok=True)
    for tmp, dst in written:
        os.replace(tmp, dst)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def params_equal(a: Qwen, b: Qwen) -> bool:
    """Bit-for-bit equality of two models' parameters (same tree, same dtypes, same values)."""
    la, lb = jax.tree.leaves(nnx.state(a, nnx.Param)), jax.tree.leaves(nnx.state(b, nnx.Param))
    return len(la) == len(lb) and all(
        x.dtype == y.dtype and x.shape == y.shape and bool(jnp.array_equal(x, y)) for x, y in zip(la, lb, strict=True))
