"""The float GEMV (wgsl/gemv_float.wgsl): F32, F16 and BF16 weights times f32 activations at
decode-size batches, a team of lanes a row, teams widened for short matrices (a MoE router).
matmul_dispatches (kernels_matmul) and the expert banks (kernels_moe) take it."""

from __future__ import annotations

from gguf import GGMLQuantizationType as Q

from infr.gpu import kernels_matmul as KM  # (a cycle: kernels_matmul dispatches here; names read at call time)
from infr.gpu.runtime import Kernels

# Float types the float GEMV (wgsl/gemv_float.wgsl) runs: its dot of one 16-byte load, and the
# vec4 of activations that load meets.
FLOAT_GEMV = {Q.F32: ("wdot_f32", 1), Q.F16: ("wdot_f16", 2), Q.BF16: ("wdot_bf16", 2)}
FLOAT_GEMV_WG = 256  # gemv_float.wgsl's workgroup
FLOAT_GEMV_U = 4  # 16-byte loads a lane issues before it uses them
# Workgroups a float GEMV dispatch aims for before it stops widening its teams: a small matrix
# (the 1 MiB router) is latency-bound, so more lanes with fewer loads each finish it sooner.
_FLOAT_GEMV_GROUPS = 256


def has_float_gemv(qtype, x_stride: int) -> bool:
    """Whether the float GEMV runs this type with activation rows `x_stride` floats apart (its x
    is read in vec4, so the stride must keep every row 16-byte aligned)."""
    return Q(int(qtype)) in FLOAT_GEMV and x_stride % 4 == 0


def float_gemv_team(rows: int, rb: int, y_groups: int, max_groups: int) -> int:
    """Lanes per row for a float GEMV over `rows` rows of `rb` bytes with `y_groups` token groups:
    32, doubled (up to the workgroup) while the dispatch has fewer than _FLOAT_GEMV_GROUPS
    workgroups and each lane keeps at least two loads; never more workgroups along x than a
    dispatch dimension allows."""
    nv, team = rb // 16, 32

    def groups(t: int) -> int:
        return -(-rows // (FLOAT_GEMV_WG // t))

    while team < FLOAT_GEMV_WG and groups(team) * y_groups < _FLOAT_GEMV_GROUPS and nv >= 4 * team \
            and groups(2 * team) <= max_groups:
        team *= 2
    return team


def float_gemv_consts(qtype, team: int, nt: int, sg: int, expert: bool = False) -> dict:
    """gemv_float.wgsl's constants: `team` lanes a row, `nt` tokens a workgroup, subgroup size `sg` (0: none)."""
    wdot, xv = FLOAT_GEMV[KM.as_qtype(qtype)]
    return dict(TEAM=team, NT=nt, U=FLOAT_GEMV_U, SG=sg, SUBGROUP_ADD="subgroupAdd" if sg else "no_subgroups",
                XV=xv, WDOT=wdot, EXPERT=KM.expert_include(expert))


def float_gemv_pipeline(kernels: Kernels, qtype, rows: int, K: int, T: int = 1, expert: bool = False):
    """The float GEMV over `rows` rows of K values (a weight chunk, or one expert's) for batches of T
    (expert: T pairs, one a workgroup), with GemvTuning's SG, NT and UNCHECKED; its rows and tokens
    per workgroup."""
    t = KM.GemvTuning.for_device(kernels.dev)
    nt = 1 if expert else t.tokens(T)
    team = float_gemv_team(rows, KM.row_bytes(qtype, K), -(-T // nt), KM.max_groups(kernels.dev))
    pipe = kernels.pipeline("gemv_float", "main", unchecked=bool(t.UNCHECKED),
                            **float_gemv_consts(qtype, team, nt, t.SG, expert))
    return pipe, FLOAT_GEMV_WG // team, nt
