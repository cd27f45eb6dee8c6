"""Every tuning knob of the GPU kernels in one object, read from the environment once.

INFR_GEMV_*, INFR_MMQ_*, INFR_MMA*, INFR_ATTN_*, INFR_SUBMIT_* and INFR_GEMM_MIN_T set it (for
measuring; the defaults are the measured best). Kernels ask `current()`, never
os.environ, so a graph build costs no environment lookups and a knob means the same
in every module. A benchmark that changes the variables in-process calls `reload()`;
a test takes `override(...)` or sets them and reloads.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class AttentionTuning:
    """kernels_attention's knobs: keys per split-K chunk (0: by context length),
    split-K workgroups per dispatch at full depth, the keys up to which decode
    takes the one-pass kernel, the largest batch split-K takes, and the context
    up to which one pass serves every depth."""

    chunk: int = 0
    wgs: int = 512
    split_from: int = 256  # perf/h200/split-from-2026-12-05-h100.txt
    split_t: int = 4
    one_pass_ctx: int = 1024
    tiled: int = 0  # the prefill kernel: 0 by device (kernels_attention.tiled_kernel), 1 attn_tiled, 2 attn_tiled2,
    # 3 attn_mma (the tensor cores)
    mma: tuple[int, int] | None = None  # attn_mma's (M, BK) tiling, for tuning
    tiled2: tuple[int, int, int] | None = None  # attn_tiled2's (M, QPI, KPI) tiling, for tuning
    # 1: prefill at head dims past 256 (Gemma 4's full layers, 512) takes the tiled kernels; 0: the one-pass
    # kernel, which an H100 ran faster at 512 (perf/attn_prefill_time.py --wide --flavor dawn, 8/1 heads:
    # 772 µs against attn_tiled's 837 and attn_tiled2's 860; perf/h200/attention-d512-and-host-2026-12-06-h100.txt)
    wide: int = 0

    @classmethod
    def from_env(cls, env) -> AttentionTuning:
        names = {"chunk": "INFR_ATTN_CHUNK", "wgs": "INFR_ATTN_WGS", "split_from": "INFR_ATTN_SPLIT_FROM",
                 "split_t": "INFR_ATTN_SPLIT_T", "one_pass_ctx": "INFR_ATTN_ONE_PASS_CTX", "tiled": "INFR_ATTN_TILED",
                 "wide": "INFR_ATTN_WIDE"}
        t = cls(**{k: int(env[v]) for k, v in names.items() if env.get(v)})
        if env.get("INFR_ATTN_TILED2"):
            t = replace(t, tiled2=tuple(int(x) for x in env["INFR_ATTN_TILED2"].split(",")))
        if env.get("INFR_ATTN_MMA"):
            t = replace(t, mma=tuple(int(x) for x in env["INFR_ATTN_MMA"].split(",")))
            M, BK = t.mma if len(t.mma) == 2 else (0, 0)
            if M < 16 or M & (M - 1) or BK <= 0 or BK % 32:
                raise ValueError(f"INFR_ATTN_MMA must be 'M,BK': M a power of two of 16 or more, BK a multiple "
                                 f"of 32, got {env['INFR_ATTN_MMA']!r}")
        if t.chunk and (t.chunk % 128 or not 0 < t.chunk <= 512):
            raise ValueError(f"INFR_ATTN_CHUNK must be 128, 256, 384 or 512, got {t.chunk}")
        return t


def _gemv(env):
    from infr.gpu.kernels_matmul import GemvTuning

    return GemvTuning.from_env(env)


def _mmq(env):
    from infr.gpu.kernels_mmq import MmqTuning

    return MmqTuning.from_env(env)


def _mma(env):
    from infr.gpu.kernels_mma import MmaTuning

    return MmaTuning.from_env(env)


@dataclass(frozen=True)
class Tuning:
    """gemv: kernels_matmul.GemvTuning (SG -1: the device's subgroup size);
    mmq: kernels_mmq.MmqTuning; mma: kernels_mma.MmaTuning (the tensor-core
    tiles that replace mmq's on Dawn); attention: AttentionTuning; gemm_min_t: the
    smallest batch the f32 GEMM takes (None: kernels_gemm's rule; 0 in the
    environment: never); deltanet_chunk_rows: the smallest prompt batch the chunked
    delta rule takes (kernels_deltanet.chunk_rows: CHUNK_ROWS, CHUNK_ROWS_DAWN on Dawn; INFR_DELTANET_CHUNK_ROWS, 0: never);
    submit_parts: command buffers a step of submit_min_t rows or more is submitted in as it is
    encoded (INFR_SUBMIT_PARTS, INFR_SUBMIT_MIN_T; 1: one, as every measurement so far)."""

    gemv: object = field(default_factory=lambda: _gemv({}))
    mmq: object = field(default_factory=lambda: _mmq({}))
    mma: object = field(default_factory=lambda: _mma({}))
    attention: AttentionTuning = field(default_factory=AttentionTuning)
    gemm_min_t: int | None = None
    deltanet_chunk_rows: int | None = None
    # Dawn records a command buffer's Vulkan commands at submit: 4.5 ms of Gemma 4 E2B's 73 ms prompt
    # forward (perf/prompt_host_time.py) in which the GPU has nothing yet. In parts, the GPU starts on
    # the first while the host records the rest. Not yet timed on a GPU, so off.
    submit_parts: int = 1
    submit_min_t: int = 64
    # The prompt-batch matmuls number their workgroups token tiles first (not expert tiles), so the token
    # tiles sharing a weight tile run together and read it from the cache once: -1 (default) the tensor
    # cores' (gemm_mma), 1 (INFR_GEMM_TOKENS_FIRST=1) the int8 GEMM's too (not timed), 0 neither (grid order,
    # where at T = 512 each of the 8B's four token tiles streamed the gate||up pair's 235 MB of f16 rows from
    # memory again). On an H100 (8B pp512, best of 4, runs alternated; perf/h200/s41-2026-12-07-h100.txt)
    # 8111.7 / 8281.8 t/s against 8047.7 / 8171.3.
    gemm_tokens_first: int = -1
    # 1 (INFR_MOE_COMBINE_NORM=1): a MoE's combine also does the next norm of the stream, rounded (fusion.py's
    # moe_residual_norm, moe_combine_q8.wgsl; the same bits); 0 (default): the combine, then rmsnorm_q8 (or the
    # next GEMV's prologue where kernels_norm_in takes it). The fused form saves a dispatch a layer (Qwen3-30B-A3B:
    # 27 against 28 over perf/dispatch_counts.py's two layers) but was slower, likely as a decode step's row is
    # then ceil(D / 1024) workgroups each reading every pair's row: Qwen3-30B-A3B tg128 on an H100 (Dawn, best of
    # 3, alternated; perf/h200/s42-2026-12-07-h100.txt) 214.7 / 219.1 t/s with it against 228.8 / 228.7 without.
    moe_combine_norm: int = 0

    @classmethod
    def from_env(cls, env=None) -> Tuning:
        env = os.environ if env is None else env
        gemm = env.get("INFR_GEMM_MIN_T")
        chunk = env.get("INFR_DELTANET_CHUNK_ROWS")
        parts, part_t = int(env.get("INFR_SUBMIT_PARTS") or 1), int(env.get("INFR_SUBMIT_MIN_T") or 64)
        if parts < 1 or part_t < 1:
            raise ValueError(f"INFR_SUBMIT_PARTS and INFR_SUBMIT_MIN_T must be at least 1, got {parts}, {part_t}")
        first = env.get("INFR_GEMM_TOKENS_FIRST") or "-1"
        if first not in ("-1", "0", "1"):
            raise ValueError(f"INFR_GEMM_TOKENS_FIRST must be 0 or 1, got {first!r}")
        moe_norm = env.get("INFR_MOE_COMBINE_NORM") or "0"
        if moe_norm not in ("0", "1"):
            raise ValueError(f"INFR_MOE_COMBINE_NORM must be 0 or 1, got {moe_norm!r}")
        return cls(
            gemv=_gemv(env), mmq=_mmq(env), mma=_mma(env), attention=AttentionTuning.from_env(env),
            gemm_min_t=(int(gemm) if int(gemm) > 0 else 1 << 30) if gemm else None,
            deltanet_chunk_rows=(int(chunk) if int(chunk) > 0 else 1 << 30) if chunk else None,
            submit_parts=parts, submit_min_t=part_t, gemm_tokens_first=int(first), moe_combine_norm=int(moe_norm),
        )


_current: list[Tuning] = []


def current() -> Tuning:
    """The process's tuning: read from the environment at the first call."""
    if not _current:
        _current.append(Tuning.from_env())
    return _current[0]


def reload() -> Tuning:
    """Read the environment again (a benchmark that changed INFR_* between models)."""
    _current[:] = [Tuning.from_env()]
    return _current[0]


@contextmanager
def override(**changes):
    """The current tuning with some fields replaced, for the block (tests)."""
    old = current()
    _current[:] = [replace(old, **changes)]
    try:
        yield _current[0]
    finally:
        _current[:] = [old]
