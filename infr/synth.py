"""Synthetic GGUF models: a family's real tensor names and metadata, random weights.

They serve two purposes. Tiny ones (F32) run through llama.cpp and infr alike
and make an exact oracle for families with no small real model (qwen3).
Full-size ones (the real shapes of Llama 3, Qwen 2.5/3, Qwen3-30B-A3B, Llama-4-Scout)
with quantized matrices feed benchmarks without downloading gigabytes. The MoE families'
experts, router and rules live in infr/synth_moe.py, qwen35's DeltaNet layers in
infr/synth_qwen35.py, SynthSpec and the weight types in infr/synth_spec.py, the presets in
infr/synth_presets.py.

`write_gguf(spec, path, seed)` is deterministic: the same spec and seed give
the same bytes (tests compare sha256 against fixtures made by llama.cpp).
Every tensor draws from its own generator seeded by (seed, tensor name, row
chunk), so a tensor's values do not depend on the tensors around it, on the
weight type, or on memory: an F32 and a Q4_K file hold the same weights up to
quantization. Values are uniform draws, not normal ones, because uniform
float32 draws are a fixed bit transform of the generator's output, which is
the part of numpy's streams least likely to change between versions.

Weight types are llama-quantize's file types with its per-tensor mixes
(Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, IQ4_XS, ...: the files people download),
"NAME-pure" for every matrix in one type, and Q4_K / Q5_K for all-Q4_K / all-Q5_K.

The tokenizer is llama.cpp's `test` model: it needs only
`tokenizer.ggml.tokens` (no merges, scores or types); callers feed token ids.

    python -m infr.synth tiny-qwen3 /tmp/q3.gguf
    python -m infr.synth qwen3-0.6b /tmp/q3.gguf --type Q4_K_M --seed 1
    python -m infr.synth llama-3.1-8b /tmp/8b-iq4.gguf --type IQ4_XS
"""

from __future__ import annotations

import argparse
import math
import sys
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFEndian, GGUFWriter
from gguf import LlamaFileType as _F
from gguf.constants import GGML_QUANT_SIZES

from infr import synth_gemma4, synth_moe, synth_qwen35
from infr.synth_encode import encode
from infr.synth_presets import PRESETS, preset
from infr.synth_spec import (ARCHS, DEFAULT_MIX, FILE_TYPES, WEIGHT_TYPE_INFO, WEIGHT_TYPES, Llama3Rope, SynthSpec,
                             WeightType)

__all__ = ["ARCHS", "DEFAULT_MIX", "FILE_TYPES", "PRESETS", "WEIGHT_TYPE_INFO", "WEIGHT_TYPES", "Llama3Rope",
           "SynthSpec", "WeightType", "encode", "matrix_type", "preset", "reference_weights", "tensor_nbytes",
           "tensor_plans", "write_gguf"]

CHUNK_ELEMENTS = 1 << 22  # rows are generated this many values at a time
BIAS_STD = 0.2
NORM_SPREAD = 0.2  # norm weights are uniform in 1 +- this


# llama.cpp's substitutes when a row length is not a multiple of 256.
K_FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0, Q.IQ4_XS: Q.IQ4_NL}


def _use_more_bits(i: int, n: int) -> bool:
    # The layers whose attn_v and ffn_down Q4_K_M and Q5_K_M give 6 bits.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _mixed_type(spec: SynthSpec, wt: WeightType, name: str) -> Q:
    """llama.cpp's choice for one matrix of a file type (the facts above)."""
    if spec.arch == "gemma4" and name == "per_layer_token_embd.weight":
        return synth_gemma4.mixed_type(spec, wt.ftype, name, wt.base, _use_more_bits) or wt.base
    if name == "output.weight" or (spec.tied and name == "token_embd.weight"):
        return Q.Q8_0 if wt.base == Q.Q8_0 else Q.Q6_K
    if not name.startswith("blk."):
        return wt.base
    g4 = synth_gemma4.mixed_type(spec, wt.ftype, name, wt.base, _use_more_bits) if spec.arch == "gemma4" else None
    moe = synth_moe.mixed_type(spec, wt.ftype, name, wt.base) if spec.n_expert else None
    if g4 is not None or moe is not None:
        return g4 if g4 is not None else moe
    layer, n = int(name.split(".")[1]), spec.n_layers
    k_mix = wt.ftype in (_F.MOSTLY_Q4_K_M, _F.MOSTLY_Q5_K_M)
    if name.endswith(("attn_v.weight", "attn_qkv.weight")):  # one category (qwen35's DeltaNet qkv)
        if k_mix and _use_more_bits(layer, n):
            return Q.Q6_K
        if wt.ftype == _F.MOSTLY_IQ4_XS and spec.n_heads // spec.n_kv_heads >= 4:
            return Q.Q5_K
    elif "ffn_down" in name:  # ffn_down, ffn_down_exps, ffn_down_shexp: one category, layer from the name
        if k_mix and _use_more_bits(layer, n):
            return Q.Q6_K
        if wt.ftype == _F.MOSTLY_IQ4_XS and layer < n // 8:
            return Q.Q5_K
    return wt.base


def matrix_type(spec: SynthSpec, name: str, n_cols: int) -> Q:
    """The GGML type of one matrix under spec.weight_type."""
    wt = WEIGHT_TYPE_INFO[spec.weight_type]
    if name.endswith("ffn_gate_inp.weight") and wt.base != Q.F32:
        return Q.F32  # the router is never quantized, even with --pure
    qtype = _mixed_type(spec, wt, name) if wt.mixed else wt.base
    if qtype in K_FALLBACK and n_cols % 256:
        qtype = K_FALLBACK[qtype]
    block = GGML_QUANT_SIZES[qtype][0]
    if n_cols % block:
        raise ValueError(f"{name}: row length {n_cols} is not a multiple of {qtype.name}'s block of {block}")
    return qtype


# --- tensors -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TensorPlan:
    name: str
    shape: tuple[int, ...]  # numpy order: (rows, cols), or (n_expert, rows, cols) for an expert bank
    kind: str  # "matrix", "norm", "bias", "rope_freqs"
    qtype: Q


def tensor_plans(spec: SynthSpec) -> list[_TensorPlan]:
    """Every tensor of the model, in file order, with names as llama.cpp expects them."""
    e, hd, ff = spec.n_embd, spec.head_dim, spec.n_ff
    q_out, kv_out = spec.n_heads * hd, spec.n_kv_heads * hd
    out: list[_TensorPlan] = []

    def mat(name: str, rows: int, cols: int) -> None:
        out.append(_TensorPlan(name, (rows, cols), "matrix", matrix_type(spec, name, cols)))

    def vec(name: str, n: int, kind: str) -> None:
        out.append(_TensorPlan(name, (n,), kind, Q.F32))

    def bank(name: str, n_expert: int, rows: int, cols: int) -> None:
        out.append(_TensorPlan(name, (n_expert, rows, cols), "matrix", matrix_type(spec, name, cols)))

    def raw(name: str, shape: tuple[int, ...], kind: str) -> None:
        out.append(_TensorPlan(name, shape, kind, Q.F32))

    if spec.arch == "gemma4":
        synth_gemma4.tensors(spec, mat, vec, bank, raw)
        return out
    mat("token_embd.weight", spec.n_vocab, e)
    if spec.rope_scaling is not None:
        vec("rope_freqs.weight", hd // 2, "rope_freqs")
    for i in range(spec.n_layers):
        if spec.arch in synth_qwen35.QWEN35_ARCHS:
            synth_qwen35.layer_tensors(spec, i, mat, vec, raw)
            if synth_moe.is_moe_layer(spec, i):
                synth_moe.ffn_tensors(spec, i, mat, bank, vec)
            else:
                mat(f"blk.{i}.ffn_gate.weight", ff, e)
                mat(f"blk.{i}.ffn_up.weight", ff, e)
                mat(f"blk.{i}.ffn_down.weight", e, ff)
            continue
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", e, "norm")
        mat(p + "attn_q.weight", q_out, e)
        mat(p + "attn_k.weight", kv_out, e)
        mat(p + "attn_v.weight", kv_out, e)
        if spec.qkv_bias:
            vec(p + "attn_q.bias", q_out, "bias")
            vec(p + "attn_k.bias", kv_out, "bias")
            vec(p + "attn_v.bias", kv_out, "bias")
        if spec.qk_norm:
            vec(p + "attn_q_norm.weight", hd, "norm")
            vec(p + "attn_k_norm.weight", hd, "norm")
        mat(p + "attn_output.weight", e, q_out)
        if spec.arch == "gemma3":
            vec(p + "post_attention_norm.weight", e, "norm")
        vec(p + "ffn_norm.weight", e, "norm")
        if synth_moe.is_moe_layer(spec, i):
            synth_moe.ffn_tensors(spec, i, mat, bank, vec)
        else:
            mat(p + "ffn_gate.weight", ff, e)
            mat(p + "ffn_up.weight", ff, e)
            mat(p + "ffn_down.weight", e, ff)
        if spec.arch == "gemma3":
            vec(p + "post_ffw_norm.weight", e, "norm")
    vec("output_norm.weight", e, "norm")
    if not spec.tied:
        mat("output.weight", spec.n_vocab, e)
    return out


def _uniform(seed: int, name: str, chunk: int, n: int, half_width: float) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), chunk])
    u = rng.random(n, dtype=np.float32)
    return (u * np.float32(2.0) - np.float32(1.0)) * np.float32(half_width)


def _vector_values(spec: SynthSpec, t: _TensorPlan, seed: int) -> np.ndarray:
    n = t.shape[0]
    if t.kind in synth_gemma4.VECTOR_KINDS:
        return synth_gemma4.vector_values(spec, t.name, t.kind, n, seed, _uniform)
    if t.kind == "rope_freqs":
        assert spec.rope_scaling is not None
        return spec.rope_scaling.freq_factors(spec.rope_theta, spec.head_dim)
    if t.kind == "norm":
        return np.float32(1.0) + _uniform(seed, t.name, 0, n, NORM_SPREAD)
    if t.kind == "ssm_a":  # -exp(A_log), A_log uniform in -1..1
        return (-np.exp(_uniform(seed, t.name, 0, n, 1.0))).astype(np.float32)
    if t.kind == "row":  # one matrix row (qwen35moe's shared-expert gate): a matrix's scale
        return _uniform(seed, t.name, 0, n, math.sqrt(3.0 / n))
    return _uniform(seed, t.name, 0, n, BIAS_STD * math.sqrt(3.0))


def _chunk_bounds(t: _TensorPlan) -> list[tuple[int, int]]:
    """(chunk number, rows) of each fixed row chunk of a matrix (an expert bank's rows run on
    from one expert to the next)."""
    rows, cols = int(np.prod(t.shape[:-1])), t.shape[-1]
    per_chunk = max(1, CHUNK_ELEMENTS // cols)
    return [(c, min(per_chunk, rows - start)) for c, start in enumerate(range(0, rows, per_chunk))]


def _chunk_values(t: _TensorPlan, seed: int, c: int, n: int) -> np.ndarray:
    cols = t.shape[-1]
    return _uniform(seed, t.name, c, n * cols, math.sqrt(3.0 / cols)).reshape(n, cols)


def _matrix_chunks(t: _TensorPlan, seed: int) -> Iterator[np.ndarray]:
    """Rows in fixed chunks; each value has std 1/sqrt(row length), so every
    matmul keeps its input's scale and activations stay O(1) in any depth."""
    for c, n in _chunk_bounds(t):
        yield _chunk_values(t, seed, c, n)


def _encoded_chunk(job: tuple) -> bytes:
    t, seed, c, n = job
    return np.ascontiguousarray(encode(_chunk_values(t, seed, c, n), t.qtype)).tobytes()


class _StreamedTensor:
    """Quacks like the ndarray GGUFWriter.write_tensor_data expects (nbytes,
    tofile) but encodes one row chunk at a time, so an 8B model never sits in
    memory as float32."""

    def __init__(self, t: _TensorPlan, seed: int, pool=None):
        self.t, self.seed, self.pool = t, seed, pool
        self.nbytes = tensor_nbytes(t)

    def tofile(self, f) -> None:
        jobs = [(self.t, self.seed, c, n) for c, n in _chunk_bounds(self.t)]
        # Chunks are independent (each seeds its own generator): encoded in
        # parallel where there are cores, written in order, same bytes.
        for data in (self.pool.map(_encoded_chunk, jobs) if self.pool else map(_encoded_chunk, jobs)):
            f.write(data)


def tensor_nbytes(t: _TensorPlan) -> int:
    block, size = GGML_QUANT_SIZES[t.qtype]
    n = int(np.prod(t.shape))
    return n // block * size


def _payload_dtype(qtype: Q) -> np.dtype:
    return {Q.F32: np.dtype(np.float32), Q.F16: np.dtype(np.float16)}.get(qtype, np.dtype(np.uint8))


def _byte_shape(t: _TensorPlan) -> tuple[int, ...]:
    if t.qtype in (Q.F32, Q.F16):
        return t.shape
    return (*t.shape[:-1], tensor_nbytes(t) // int(np.prod(t.shape[:-1])))


# --- the file ----------------------------------------------------------------------------------


def _add_metadata(w: GGUFWriter, spec: SynthSpec) -> None:
    w.add_name(spec.name)
    w.add_context_length(spec.ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layers)
    w.add_feed_forward_length(synth_gemma4.n_ff(spec))
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(synth_gemma4.kv_heads(spec))
    # Converters write key/value lengths when they differ from n_embd / n_heads
    # (and always for qwen3 and gemma3, whose configs carry head_dim).
    if spec.qk_norm or spec.head_dim * spec.n_heads != spec.n_embd:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.norm_eps)
    if spec.arch in ("llama", "llama4"):
        w.add_rope_dimension_count(spec.head_dim)
        w.add_vocab_size(spec.n_vocab)
    synth_moe.add_metadata(w, spec)
    synth_qwen35.add_metadata(w, spec)
    synth_gemma4.add_metadata(w, spec)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    w.add_file_type(int(FILE_TYPES[spec.weight_type]))
    if spec.weight_type not in ("F32", "F16", "BF16"):
        w.add_quantization_version(2)
    if spec.chat_template is not None:
        w.add_chat_template(spec.chat_template)
    if spec.tokenizer == "gpt2":
        # A byte-level BPE vocabulary: GPT-2's 256 byte symbols, then fillers;
        # llama.cpp insists on a merges list, so give it one.
        byte_chars = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + [
            chr(c) for c in range(174, 256)]
        byte_chars += [chr(256 + i) for i in range(256 - len(byte_chars))]
        tokens = byte_chars + [f"t{i}" for i in range(spec.n_vocab - len(byte_chars))]
        # special tokens take the last fillers' places (t0 must stay: the merge list makes it)
        first = spec.n_vocab - len(spec.special_tokens)
        specials = set(range(first, spec.n_vocab))
        tokens[first:] = spec.special_tokens
        # Bytes >= 128 alone are not UTF-8: as control tokens they print nothing,
        # so random greedy output never trips a server's text handling.
        non_ascii = set(range(94, 188)) | {i for i in range(188, 256) if not (i - 188 <= 32 or i - 188 == 33)}
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([3 if i in non_ascii or i in specials else 1 for i in range(spec.n_vocab)])
        w.add_token_merges(["t 0"])
        # Without named ones, BOS and EOS are the first two byte symbols (as llama.cpp's test files)
        named = {t: tokens.index(t) for t in ("<bos>", "<eos>") if t in spec.special_tokens}
        w.add_bos_token_id(named.get("<bos>", 0))
        w.add_eos_token_id(named.get("<eos>", 1))
        return
    w.add_tokenizer_model("test")
    # llama.cpp's test tokenizer prints a token as its id in hex; name tokens so.
    w.add_token_list([f"{i:x}" for i in range(spec.n_vocab)])


def write_gguf(spec: SynthSpec, path: str | Path, seed: int = 0) -> Path:
    """Write `spec` with weights drawn from `seed`; same inputs, same bytes."""
    spec.validate()
    path = Path(path)
    plans = tensor_plans(spec)
    w = GGUFWriter(path, spec.arch)
    pool = _pool() if sum(tensor_nbytes(t) for t in plans) > 1 << 28 else None
    try:
        _add_metadata(w, spec)
        for t in plans:
            w.add_tensor_info(t.name, _byte_shape(t), _payload_dtype(t.qtype), tensor_nbytes(t), raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for t in plans:
            if t.kind == "matrix":
                data = _StreamedTensor(t, seed, pool)
            else:
                data = _vector_values(spec, t, seed)
            w.write_tensor_data(data, tensor_endianess=GGUFEndian.LITTLE)  # type: ignore[arg-type]
    finally:
        w.close()
        if pool is not None:
            pool.shutdown()
    return path


def _pool():
    """Worker processes for encoding big models (the H200 host has 16 cores), or None."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n < 4 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork"))


def reference_weights(spec: SynthSpec, name: str, seed: int = 0) -> np.ndarray:
    """The float32 values `write_gguf` draws for one tensor, before quantization."""
    for t in tensor_plans(spec):
        if t.name == name:
            if t.kind == "matrix":
                return np.concatenate(list(_matrix_chunks(t, seed))).reshape(t.shape)
            return _vector_values(spec, t, seed)
    raise KeyError(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m infr.synth", description="Write a random-weight GGUF model.")
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--type", default=None, choices=WEIGHT_TYPES,
                    help="a llama-quantize file type (with its per-tensor mix), NAME-pure, Q4_K or Q5_K "
                         "(default: the preset's, F32)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    spec = PRESETS[args.preset]
    if args.type:
        spec = replace(spec, weight_type=args.type)
    try:
        path = write_gguf(spec, args.out, seed=args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{path}: {spec.arch} {spec.n_layers} layers, d={spec.n_embd}, {spec.weight_type}, "
          f"{path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
