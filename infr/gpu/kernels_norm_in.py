"""The GEMV that norms its own input (wgsl/gemv_norm_on.wgsl): a plain RMSNorm whose output only
int8 GEMVs read is not a dispatch of its own; each GEMV workgroup norms and rounds the row into
workgroup memory in its prologue, with rmsnorm_q8's sums and rounding (the same bits). Decode is
bound by its dispatches (perf/h200/decode-encode-vs-gpu-*).

Where it applies (takes): GemvTuning.NORM, one token a step (T = 1: each workgroup norms its one
row), K % 256 == 0 (rmsnorm_q8's unit) up to MAX_K, subgroups of 8 or more (a block's max and sum
are shuffled), the rounded row within the device's workgroup memory beside the GEMV's own, and at
most MAX_PROLOGUE_BYTES read by the prologues of all the GEMV's workgroups together (each reads the
row and the norm weight, 8 K bytes). The lowering offers it to the q|k|v stack, plain products and
the gate||up pair, but not to the pair that rounds its output for down (Lowering.gate_up): its
workgroups of 1024 invocations leave no other workgroup on the SM to hide the prologue behind.
Measured on an H100 through Dawn, tg128 (perf/README.md, stop 40): every norm fused, the 1B +8 %
(1036 -> 1114 and 1124 t/s), the 8B -4 % (its q|k|v and pair prologues read 24 and 14 MiB); under
8 MiB, qwen35-4b's rounding pairs (5.6 MiB) lost 2.5 % (312 -> 303, 305); the 1B's q|k|v alone (6 MiB)
+3.5 to 5 % (1052, 1041 -> 1105, 1077), its rounding pair alone (4 MiB) +1.7 %. Elsewhere the norm
runs as rmsnorm_q8 before the GEMV.
"""
from __future__ import annotations

from dataclasses import dataclass

from infr.gpu import kernels_q8 as KQ

MAX_K = 8192  # an invocation holds K / 1024 words of the row and of the weight in registers
MAX_PROLOGUE_BYTES = 8 << 20
BINDING = 15  # the norm weight's binding: past the rope epilogue's 8 .. 14 and the pair's table (11)


@dataclass(frozen=True)
class NormIn:
    """A GEMV input still to be normed: x (rows of K floats), the norm weight g (K floats), eps."""

    x: object
    g: object
    K: int
    eps: float

    def consts(self) -> dict:
        return {"NORM_IN": "// #include gemv_norm_on", "NORM_K": self.K}

    def resources(self, res: list) -> list:
        """A GEMV's bindings `res` (binding 2 its x) with the norm weight at BINDING."""
        return list(res) + [None] * (BINDING - len(res)) + [self.g]


def given(xq, K: int) -> NormIn | None:
    """The NormIn a GEMV dispatcher's `xq` is (its rows K wide), or None."""
    if not isinstance(xq, NormIn):
        return None
    if xq.K != K:
        raise ValueError(f"a norm of {xq.K} values feeds no GEMV over {K}")
    return xq


def off_consts() -> dict:
    return {"NORM_IN": "// #include gemv_norm_off", "NORM_K": 0}


def workgroup_bytes(K: int) -> int:
    """The prologue's workgroup memory: the rounded row, its scale words staged, the sum's 256 floats."""
    return 4 * KQ.words(K) + K // 4 + 4 * 256


def takes(dev, K: int, N: int, T: int, shared: int, buffers: int, rows_wg: int) -> bool:
    """Whether a GEMV of N rows over K (rows_wg a workgroup), for a batch of T rows, norms its input
    itself on `dev` (the module's docstring): `shared` its own workgroup bytes, `buffers` its storage
    buffers (kernels_matmul.gemv_needs)."""
    from infr.gpu.kernels_matmul import GemvTuning

    t = GemvTuning.for_device(dev)
    limits = getattr(dev, "limits", None) or {}
    return (
        bool(t.NORM) and t.SG >= 8 and T == 1 and K % 256 == 0 and K <= MAX_K
        and -(-N // rows_wg) * 8 * K <= MAX_PROLOGUE_BYTES
        and int(limits.get("max-compute-workgroup-storage-size", 16384)) >= shared + workgroup_bytes(K)
        and int(limits.get("max-storage-buffers-per-shader-stage", 8)) >= buffers + 1
    )
