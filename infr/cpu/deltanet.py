"""The gated DeltaNet mixer on the CPU (qwen35, wave2-families.md section 2.3), token-serial as
llama.cpp's fused CPU op computes it, and the recurrent state it keeps per sequence.

State: per (sequence slot, layer) the conv's last d_conv - 1 inputs [d_conv - 1, conv_dim] and
S [n_v_heads, d_k, d_v], f32, with the position the sequence stands at. A sequence's rows at
position 0 start it from zeros; rows anywhere else must continue exactly where its state stands
(the state cannot be rewound), so a prefix skipped by a cache or a stale slot is refused, not
computed wrong. Rows of different slots never touch each other's state: batched equals alone.
A slot's state can be copied out whole (snapshot) and a copy put back at the position it was
taken at (restore): the engine's prefix checkpoints (infr/checkpoints.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infr.errors import InfrError
from infr.models.spec import DeltaNetSpec

F32 = np.float32


def sigmoid(x: np.ndarray) -> np.ndarray:
    return (F32(1.0) / (F32(1.0) + np.exp(-x.astype(F32)))).astype(F32, copy=False)


def softplus(x: np.ndarray) -> np.ndarray:
    """ggml's softplus: log(1 + exp(x)), x itself above 20."""
    x = x.astype(F32)
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, F32(20))))).astype(F32)


def silu(x: np.ndarray) -> np.ndarray:
    return (x / (F32(1.0) + np.exp(-x))).astype(F32, copy=False)


@dataclass
class SeqState:
    conv: np.ndarray  # [d_conv - 1, conv_dim]: the last inputs, oldest first
    S: np.ndarray  # [n_v_heads, d_k, d_v]
    pos: int = 0  # the next position this state expects

    @classmethod
    def zeros(cls, m: DeltaNetSpec) -> "SeqState":
        return cls(np.zeros((m.d_conv - 1, m.conv_dim), F32), np.zeros((m.n_v_heads, m.d_k, m.d_v), F32))


@dataclass(frozen=True)
class Snapshot:
    """Copies of one slot's state of every DeltaNet layer, standing at position pos."""

    pos: int
    layers: dict[int, tuple[np.ndarray, np.ndarray]]  # layer -> (conv, S)


class RecurrentStore:
    """Every sequence slot's state of every DeltaNet layer (made on a sequence's first row)."""

    def __init__(self, specs: dict[int, DeltaNetSpec]):
        self.specs = specs
        self._states: dict[tuple[int, int], SeqState] = {}

    def take(self, slot: int, layer: int, start: int) -> SeqState:
        """Slot's state of layer, for rows from position start on: fresh at 0, else the one
        standing exactly at start."""
        key = (slot, layer)
        if start == 0:
            st = self._states[key] = SeqState.zeros(self.specs[layer])
            return st
        st = self._states.get(key)
        if st is None or st.pos != start:
            at = "none" if st is None else f"position {st.pos}"
            raise InfrError(f"layer {layer}: slot {slot} resumes at position {start}, but its recurrent state "
                            f"stands at {at}: a recurrent model's sequence cannot skip or rewind positions")
        return st

    def snapshot(self, slot: int) -> Snapshot:
        """Copies of slot's state of every layer, as it stands after the last step."""
        sts = {layer: self._states.get((slot, layer)) for layer in self.specs}
        pos = {st.pos for st in sts.values() if st is not None}
        if None in sts.values() or len(pos) != 1:
            raise InfrError(f"slot {slot} has no recurrent state to snapshot (or its layers stand apart)")
        return Snapshot(pos.pop(), {layer: (st.conv.copy(), st.S.copy()) for layer, st in sts.items()})

    def restore(self, slot: int, snap: Snapshot, pos: int) -> None:
        """Slot's state becomes copies of snap, standing at pos: where snap was taken, nowhere else."""
        if not isinstance(snap, Snapshot) or snap.layers.keys() != self.specs.keys():
            raise InfrError("not a snapshot of this model's recurrent layers")
        if snap.pos != pos:
            raise InfrError(f"a recurrent state snapshot taken at position {snap.pos} cannot stand at {pos}")
        for layer, (conv, S) in snap.layers.items():
            self._states[(slot, layer)] = SeqState(conv.copy(), S.copy(), pos)

    def free(self, slot: int) -> None:
        for key in [k for k in self._states if k[0] == slot]:
            del self._states[key]

    def __len__(self) -> int:
        return len(self._states)


def conv_step(st: SeqState, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """One token's causal depthwise conv: c = sum_j X[j] * w[:, j] over X = [state ; x] (tap
    d_conv - 1 multiplies x); the state keeps the last d_conv - 1 rows of X."""
    X = np.concatenate([st.conv, x[None, :]], axis=0)
    c = np.zeros(x.shape, F32)
    for j in range(X.shape[0]):
        c += X[j] * w[:, j]
    st.conv = X[1:]
    return c


def l2_norm(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum(x^2) + eps) over the last axis."""
    ss = np.sum(np.square(x, dtype=F32), axis=-1, keepdims=True, dtype=F32)
    return (x / np.sqrt(ss + F32(eps))).astype(F32)


def delta_step(S: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
               beta: np.ndarray) -> np.ndarray:
    """The gated delta rule for one token, every V-head at once: S [H_v, d_k, d_v] updated in
    place; q, k [H_v, d_k] (each V-head's K-head already picked), v [H_v, d_v], g and beta [H_v].
    Returns o [H_v, d_v] = S^T q / sqrt(d_k)."""
    S *= np.exp(g)[:, None, None]
    kv = np.einsum("hkv,hk->hv", S, k)
    delta = beta[:, None] * (v - kv)
    S += k[:, :, None] * delta[:, None, :]
    return (np.einsum("hkv,hk->hv", S, q) * F32(1.0 / np.sqrt(S.shape[1]))).astype(F32)


def k_heads(n_v: int, n_k: int) -> np.ndarray:
    """The K-head each V-head reads: h mod H_k (llama.cpp tiles the K-heads; the grouped h // (H_v / H_k)
    is wrong, tests/test_qwen35_exact.py's ablation shows)."""
    return np.arange(n_v) % n_k


def deltanet_forward(m: DeltaNetSpec, qkv: np.ndarray, z: np.ndarray, beta: np.ndarray, alpha: np.ndarray,
                     pos: np.ndarray, slots: np.ndarray, store: RecurrentStore, layer: int, conv_w: np.ndarray,
                     dt_bias: np.ndarray, a: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    """[T, n_v_heads * d_v]: each sequence's rows in position order through its own state, then
    the gated RMSNorm of each V-head times silu(z)."""
    t = len(qkv)
    hk, hv, dk, dv = m.n_k_heads, m.n_v_heads, m.d_k, m.d_v
    b = sigmoid(beta)
    g = (softplus(alpha + dt_bias) * a).astype(F32)  # <= 0: a = -exp(A_log)
    pair = k_heads(hv, hk)
    o = np.empty((t, hv, dv), F32)
    for s in np.unique(slots):
        rows = np.flatnonzero(slots == s)
        rows = rows[np.argsort(pos[rows], kind="stable")]
        p = pos[rows]
        if len(p) > 1 and not (np.diff(p) == 1).all():
            raise InfrError(f"layer {layer}: slot {int(s)}'s rows are not consecutive positions")
        st = store.take(int(s), layer, int(p[0]))
        for r in rows:
            u = silu(conv_step(st, qkv[r].astype(F32), conv_w))
            q = l2_norm(u[: hk * dk].reshape(hk, dk), eps)[pair]
            k = l2_norm(u[hk * dk: 2 * hk * dk].reshape(hk, dk), eps)[pair]
            v = u[2 * hk * dk:].reshape(hv, dv)
            o[r] = delta_step(st.S, q, k, v, g[r], b[r])
        st.pos = int(p[-1]) + 1
    ms = np.mean(np.square(o, dtype=F32), axis=-1, keepdims=True)
    y = o * (F32(1.0) / np.sqrt(ms + F32(eps))) * norm_w
    return (y * silu(z.reshape(t, hv, dv).astype(F32))).reshape(t, hv * dv).astype(F32)
