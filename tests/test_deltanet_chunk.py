"""The chunked (WY / UT-transform) form of the gated delta rule, in numpy, against the token-serial
reference (infr/cpu/deltanet.py's delta_step): the derivation wgsl/deltanet_chunk*.wgsl computes.

Per token (the reference): S <- exp(g) S; delta = beta (v - S^T k); S <- S + k delta^T; o = S^T q / sqrt(d_k).
Within a chunk of rows 0..n-1 entering with state S0, gamma_i = g_0 + .. + g_i (inclusive). Unrolled,
the row's delta solves delta_i + sum_{j<i} beta_i exp(gamma_i - gamma_j) (k_i.k_j) delta_j
= beta_i (v_i - exp(gamma_i) S0^T k_i), i.e. (I + A) D = diag(beta) (V - (exp(gamma) * K) S0) with
A strictly lower. So with T = (I + A)^-1 diag(beta): D = U - W S0, U = T V, W = T (exp(gamma) * K), and
  O = scale ((exp(gamma) * Q) S0 + ((Q K^T) * exp(gamma_i - gamma_j) * [j <= i]) D),
  S = exp(gamma_{n-1}) S0 + (exp(gamma_{n-1} - gamma) * K)^T D.
Only exp of gamma_i - gamma_j for i >= j (and of gamma itself) appear: every factor is <= 1, however
strong the decay, so nothing overflows.
"""

from __future__ import annotations

import numpy as np
import pytest

from infr.cpu.deltanet import delta_step, l2_norm, sigmoid, softplus

F32 = np.float32


def chunk_step(S0: np.ndarray, q, k, v, g, beta, scale: float):
    """One chunk of one head: S0 [d_k, d_v]; q, k [n, d_k]; v [n, d_v]; g, beta [n] (beta = sigmoid'd).
    Returns (o [n, d_v], S after the chunk)."""
    n = len(g)
    gam = np.cumsum(g)
    lower = np.tril(np.ones((n, n), bool), -1)
    decay = np.exp(np.where(lower | np.eye(n, dtype=bool), gam[:, None] - gam[None, :], 0))  # [i, j], i >= j
    A = np.where(lower, beta[:, None] * decay * (k @ k.T), 0)
    # forward substitution: X = (I + A)^-1, row by row
    X = np.zeros((n, n))
    for i in range(n):
        X[i] = -A[i] @ X
        X[i, i] = 1.0
    Tm = X * beta[None, :]
    W = Tm @ (k * np.exp(gam)[:, None])
    U = Tm @ v
    D = U - W @ S0
    M = np.where(lower | np.eye(n, dtype=bool), decay * (q @ k.T), 0)
    o = scale * ((q * np.exp(gam)[:, None]) @ S0 + M @ D)
    S = np.exp(gam[-1]) * S0 + (k * np.exp(gam[-1] - gam)[:, None]).T @ D
    return o, S


def chunked_rule(S: np.ndarray, q, k, v, g, beta, C: int):
    """A slot's rows through the chunked form, C rows a chunk; S [H, d_k, d_v] updated in place.
    q, k [n, H, d_k] (normalised, each V-head's K-head picked), v [n, H, d_v], g, beta [n, H]."""
    n, H, dk = q.shape
    o = np.empty(v.shape)
    for h in range(H):
        for c0 in range(0, n, C):
            r = slice(c0, min(n, c0 + C))
            o[r, h], S[h] = chunk_step(S[h], q[r, h], k[r, h], v[r, h], g[r, h], beta[r, h], 1 / np.sqrt(dk))
    return o


def _gates(rng, n, H):
    """Realistic gates: beta' = sigmoid(beta); g = softplus(alpha + dt_bias) * a, a = -exp(A_log),
    wide enough that some rows all but erase the state and others keep it."""
    beta = rng.standard_normal((n, H)).astype(F32)
    alpha = (3 * rng.standard_normal((n, H))).astype(F32)
    dt_bias = rng.standard_normal(H).astype(F32)
    a = -np.exp(rng.standard_normal(H)).astype(F32)
    return (softplus(alpha + dt_bias) * a).astype(F32), sigmoid(beta)


def _qkv(rng, n, H, dk):
    q = l2_norm(rng.standard_normal((n, H, dk)).astype(F32), 1e-6)
    k = l2_norm(rng.standard_normal((n, H, dk)).astype(F32), 1e-6)
    return q, k, rng.standard_normal((n, H, dk)).astype(F32)


def serial_rule(S, q, k, v, g, beta):
    return np.stack([delta_step(S, q[t], k[t], v[t], g[t], beta[t]) for t in range(len(g))])


@pytest.mark.parametrize("dk,n,C", [(16, 70, 16), (32, 100, 32), (128, 75, 32), (12, 5, 32)])
def test_chunked_equals_token_serial(dk, n, C):
    rng = np.random.default_rng(dk + n)
    H = 3
    q, k, v = _qkv(rng, n, H, dk)
    g, b = _gates(rng, n, H)
    S0 = rng.standard_normal((H, dk, dk)).astype(F32)  # a state carried in from an earlier batch
    S_ref = S0.copy()
    want = serial_rule(S_ref, q, k, v, g, b)
    S = S0.astype(np.float64)
    got = chunked_rule(S, q, k, v, g, b, C)
    # f32 token-serial vs f64 chunked: a few ulps of the running state per row
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    np.testing.assert_allclose(S, S_ref, rtol=1e-4, atol=1e-4 * np.abs(S_ref).max())


def batch_chunked(states: dict, q, k, v, g, beta, pos, slots, C: int):
    """A batch of several slots' rows (interleaved, each slot's in position order) as the GPU path
    runs it: each slot's row ids gathered in batch order (deltanet_chunk_index), chunks of C of them,
    the state zeroed where the slot's first row is at position 0."""
    o = np.empty(v.shape)
    for s in np.unique(slots):
        ids = np.flatnonzero(slots == s)
        if pos[ids[0]] == 0:
            states[s] = np.zeros_like(states[s])
        o[ids] = chunked_rule(states[s], q[ids], k[ids], v[ids], g[ids], beta[ids], C)
    return o


def test_a_batch_of_several_slots():
    rng = np.random.default_rng(7)
    H, dk, C = 2, 16, 16
    # slot 0 goes on from position 9 (state carried in), slot 1 starts over at 0 (its stale state
    # must not leak in), slot 2 starts; their rows interleaved in batch order
    runs = {0: (9, 40), 1: (0, 23), 2: (0, 1)}
    order = sum(([s] * n for s, (_, n) in runs.items()), [])
    rng.shuffle(order)
    slots = np.array(order)
    pos = np.empty(len(slots), np.int64)
    for s, (p0, n) in runs.items():
        pos[slots == s] = np.arange(p0, p0 + n)
    T = len(slots)
    q, k, v = _qkv(rng, T, H, dk)
    g, b = _gates(rng, T, H)
    carried = {s: rng.standard_normal((H, dk, dk)) for s in runs}
    ref = {s: carried[s].astype(F32) for s in runs}
    want = np.empty(v.shape, F32)
    for t in range(T):
        s = slots[t]
        if pos[t] == 0 and (slots[:t] != s).all():
            ref[s][:] = 0
        want[t] = delta_step(ref[s], q[t], k[t], v[t], g[t], b[t])
    got_states = {s: carried[s].copy() for s in runs}
    got = batch_chunked(got_states, q, k, v, g, b, pos, slots, C)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    for s in runs:
        np.testing.assert_allclose(got_states[s], ref[s], rtol=1e-4, atol=1e-4 * np.abs(ref[s]).max())
