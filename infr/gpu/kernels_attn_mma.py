"""Prefill attention on the tensor cores (wgsl/attn_mma.wgsl): the Dawn tier's attn_tiled2.

attn_tiled2 (kernels_attention) multiplies q . k and p . V with scalar FMAs: 12.9 % of the 8B's pp512 on an
H100 (perf/README.md, stop 36). Here the same walk's two products run as f16 subgroup matrices (16 x 16 x 16,
f32 results): each subgroup holds 16 query slots as HD / 16 left matrices for the whole walk, and the
exponentials, masks and the f16 rounding of the normalised probabilities stay scalar, through workgroup
memory. The query matrices, the scores and the output accumulators are variables of their own, generated
here (as kernels_mma's: arrays of matrices indexed in loops stay in memory).

Knobs (AttentionTuning, read once): INFR_ATTN_TILED=3 takes this kernel where it runs, INFR_ATTN_MMA="M,BK"
its tiling. Not by default: on an H100 through Dawn the attention tests pass at every tiling, but the 8B's
pp512 was no faster than with attn_tiled2 (8287 against 8390 t/s, runs alternated; perf/README.md, stop 40); on an H200
through Dawn 2.7-5.9x slower than attn_tiled2 at every tiling, and no faster with its K and V matrices loaded from the
cache instead of staged (perf/README.md, stop 43).
"""

from __future__ import annotations

from dataclasses import dataclass

from infr.gpu import kernels_mma as KMA
from infr.gpu import tuning as TU

MAX_DIM = 256  # past it the query matrices and accumulators outgrow a lane's registers (Gemma 4's 512: attn_tiled)
LEFT = "subgroup_matrix_left<f16, 16, 16>"
RIGHT = "subgroup_matrix_right<f16, 16, 16>"
RESULT = "subgroup_matrix_result<f32, 16, 16>"


@dataclass(frozen=True)
class AttnMma:
    """M query slots (HG heads x M / HG rows) a workgroup, 16 a subgroup; BK keys a staged tile."""

    M: int = 64
    BK: int = 32
    HG: int = 1

    @property
    def R(self) -> int:
        return self.M // self.HG

    @property
    def WG(self) -> int:
        return self.M // 16 * KMA.SUBGROUP

    def consts(self, head_dim: int, v_head_dim: int) -> dict:
        return dict(M=self.M, HG=self.HG, BK=self.BK, HD=head_dim, VD=v_head_dim,
                    LDK=max(head_dim, v_head_dim) + 8)

    def workgroup_bytes(self, head_dim: int, v_head_dim: int) -> int:
        """kv (f16 K or V tile), sc (f32 score rows), pr (f16 probability rows)."""
        return (2 * self.BK * (max(head_dim, v_head_dim) + 8) + 4 * self.M * (self.BK + 4)
                + 2 * self.M * (self.BK + 8))


def shape(n_heads: int, kv_heads: int, tiling: tuple[int, int] | None = None) -> AttnMma:
    """(M, BK) = `tiling`, else INFR_ATTN_MMA, else 64 slots and 32-key tiles. HG: the largest power of
    two dividing the GQA group, at most 8 and M (the rows of a block share the kv head's tiles)."""
    M, BK = tiling or TU.current().attention.mma or (64, 32)
    if M % 16 or M & (M - 1) or BK % 32 or BK <= 0:
        raise ValueError(f"attn_mma tiling M={M} BK={BK}: M a power of two of 16 or more, BK a multiple of 32")
    group = n_heads // kv_heads
    hg = 1
    while hg < min(8, M) and group % (2 * hg) == 0:
        hg *= 2
    return AttnMma(M, BK, hg)


def takes(dev, head_dim: int, v_head_dim: int, tile: AttnMma) -> bool:
    """Whether the kernel runs for these head dims on `dev`: its subgroup matrices (kernels_mma.available),
    dims of whole 16-value matrices up to MAX_DIM, its tiles in the device's workgroup memory."""
    limits = getattr(dev, "limits", None) or {}
    return (
        KMA.available(dev) and head_dim % 16 == 0 and v_head_dim % 16 == 0
        and max(head_dim, v_head_dim) <= MAX_DIM
        and tile.workgroup_bytes(head_dim, v_head_dim) <= int(limits.get("max-compute-workgroup-storage-size", 16384))
        and tile.WG <= int(limits.get("max-compute-invocations-per-workgroup", 256))
    )


def takes_shape(dev, n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int,
                tiling: tuple[int, int] | None = None) -> bool:
    """takes() at the tiling `shape` gives these heads (the device's matrices checked first: a tiling is
    only parsed where the kernel could run)."""
    return KMA.available(dev) and takes(dev, head_dim, v_head_dim, shape(n_heads, kv_heads, tiling))


def generated(head_dim: int, v_head_dim: int, tile: AttnMma) -> dict[str, str]:
    """The kernel's written-out parts: query matrices, score products, output accumulators, p . V, the store."""
    nd, nv, nk = head_dim // 16, v_head_dim // 16, tile.BK // 16
    ind = " " * 12
    qload = []
    for d in range(nd):
        qload += [f"    stage_q({d}u, pb, lane, qrow, r_m < nq);", "    workgroupBarrier();",
                  f"    let q_{d} = subgroupMatrixLoad<{LEFT}>(&pr, pb, false, LDP);", "    workgroupBarrier();"]
    scores = []
    for j in range(nk):
        # The first product starts the sum: a `var` declared in the tile loop without one kept the last
        # tile's scores on NVIDIA (walks of two or more tiles came out wrong, one-tile walks right).
        k_0 = f"subgroupMatrixLoad<{RIGHT}>(&kv, {16 * j}u * LDK, true, LDK)"
        scores.append(f"{ind}var s_{j} = subgroupMatrixMultiply<f32>(q_0, {k_0});")
        scores += [f"{ind}s_{j} = subgroupMatrixMultiplyAccumulate(q_{d}, subgroupMatrixLoad<{RIGHT}>(&kv, "
                   f"{16 * j}u * LDK + {16 * d}u, true, LDK), s_{j});" for d in range(1, nd)]
        scores.append(f"{ind}subgroupMatrixStore(&sc, sb + {16 * j}u, s_{j}, false, LDS);")
    pv = []
    for j in range(nk):
        pv.append(f"{ind}let p_{j} = subgroupMatrixLoad<{LEFT}>(&pr, pb + {16 * j}u, false, LDP);")
        pv += [f"{ind}o_{n} = subgroupMatrixMultiplyAccumulate(p_{j}, subgroupMatrixLoad<{RIGHT}>(&kv, "
               f"{16 * j}u * LDK + {16 * n}u, false, LDK), o_{n});" for n in range(nv)]
    ostore = []
    for n in range(nv):
        ostore += [f"    subgroupMatrixStore(&sc, sb, o_{n}, false, LDS);", "    workgroupBarrier();",
                   f"    write_out({n}u, sb, lane, orow, c0, n_rows, t0 + r_m);", "    workgroupBarrier();"]
    return {"QLOAD": "\n".join(qload), "SCORES": "\n".join(scores), "PV": "\n".join(pv),
            "ODECL": "\n".join(f"    var o_{n} = {RESULT}();" for n in range(nv)), "OSTORE": "\n".join(ostore)}


def pipeline(kernels, n_heads: int, kv_heads: int, head_dim: int, v_head_dim: int, block_size: int,
             tiling: tuple[int, int] | None = None):
    t = shape(n_heads, kv_heads, tiling)
    return kernels.pipeline("attn_mma", "main", unchecked=True, BS=block_size, **t.consts(head_dim, v_head_dim),
                            **generated(head_dim, v_head_dim, t))
