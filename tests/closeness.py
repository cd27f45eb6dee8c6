"""How close two computations of one model's logits must be (batch vs token by
token, GPU vs CPU reference).

float32 sums in another order: ~1e-2 on logits of ~20. With 8-bit activations
(infr.numerics.Q8_ACTIVATIONS: every quantized type the int8 GEMV multiplies)
a 1e-7 difference upstream that crosses a half step moves one value by a whole
step, so the two differ by sparse jumps. Measured on the first prompt's 12
tokens (tests/gpu/test_backend.py), batch vs steps and GPU vs CPU, every
rounded type on: Gemma-3 270M (Q5_0 / Q8_0 / Q4_K / Q6_K, a tied Q8_0 head)
max 1.11, RMS 0.19 of logits of RMS 4.8 (4 %); SmolLM2 (Q4_1, a Q8_0 head)
max 0.89, RMS 0.21 of 10.8; Qwen2.5-Coder max 0.35, RMS 0.05 of 4.6. With Q4_K
alone Gemma-3 was max 0.31, RMS 0.066. llama.cpp differs from itself about as
much (docs/numerics.md: 1.13 on SmolLM2 in Q8_0, one batch vs token by token).
The top-1 may then differ where the two best logits are that close: callers
compare it with assert_same_top1, which allows that only at near-ties.
"""

from __future__ import annotations

import numpy as np

from infr.numerics import Q8_ACTIVATIONS
from infr.ops import MatMul

NEAR_TIE = 0.5  # logits: a top-1 / top-2 margin below which rounding noise may swap them (as tests/test_generation.py)


GREEDY_TIE = 0.05  # logits (scale ~6 in the tiny synthetic models): a GPU greedy token may differ from the reference's below this


def greedy_tokens(backend, prompt, n: int) -> list[int]:
    """n greedy tokens after prompt through backend.forward(), one row a step from the host (what
    the GPU tests compare between backends and devices)."""
    token = int(np.argmax(backend.forward(prompt, 0)[-1]))
    out = [token]
    for i in range(n - 1):
        token = int(np.argmax(backend.forward([token], len(prompt) + i)[-1]))
        out.append(token)
    return out


def assert_follows_greedy(cpu_be, prompt, got, start: int | None = None, tie: float = GREEDY_TIE) -> None:
    """The reference follows the GPU's greedy tokens `got` after `prompt` (tokens at positions
    len(prompt) ..): each is the reference's argmax, or within `tie` of it (f32 sums in
    another order pick either of a near-tie; NEAR_TIE for real models)."""
    logits = cpu_be.forward(prompt, 0)[-1]
    for i, t in enumerate(got):
        assert logits[t] >= logits.max() - tie, (i, t, int(np.argmax(logits)), float(logits.max() - logits[t]))
        logits = cpu_be.forward([t], len(prompt) + i)[-1]


def assert_gpu_follows_cpu(gpu_be, cpu_be, prompt, n_greedy: int) -> None:
    """A GPU backend against the CPU reference on a random-token prompt: the prefill's last logits
    are close (8-bit activations), and greedy decode after its first 6 tokens is a chain of more
    than two tokens that the reference follows (near-ties may go either way)."""
    assert_logits_close(gpu_be.forward(prompt, 0, n_logits=4), cpu_be.forward(prompt, 0, n_logits=4), True)
    first = int(np.argmax(gpu_be.forward(prompt[:6], 0)[-1]))
    got = [first] + gpu_be.decode_greedy(first, 6, n_greedy)
    assert_follows_greedy(cpu_be, prompt[:6], got)
    assert len(set(got)) > 2  # a real chain, not one token repeated


def rounds_activations(gf, plan) -> bool:
    return any(isinstance(op, MatMul) and gf.tensor(op.weight).qtype in Q8_ACTIVATIONS for op in plan.ops)


def assert_logits_close(got: np.ndarray, want: np.ndarray, q8: bool, rms_frac: float = 0.06) -> None:
    if not q8:
        np.testing.assert_allclose(got, want, atol=5e-2, rtol=0)
        return
    diff = np.abs(got - want)
    rms = float(np.sqrt(np.mean(np.square(got - want))))
    scale = float(np.sqrt(np.mean(np.square(want))))
    assert diff.max() < 1.5, f"max logit difference {diff.max():.3g}"
    assert rms < rms_frac * scale, f"RMS difference {rms:.3g} vs RMS logits {scale:.3g}"


def assert_same_top1(got: np.ndarray, want: np.ndarray, q8: bool) -> None:
    """The argmax of every row agrees; with 8-bit activations, except at rows
    whose two best logits in `want` are within NEAR_TIE."""
    off = got.argmax(-1) != want.argmax(-1)
    if q8:
        top2 = np.sort(want, axis=-1)[:, -2:]
        off &= top2[:, 1] - top2[:, 0] >= NEAR_TIE
    assert not off.any(), f"top-1 differs at rows {np.nonzero(off)[0].tolist()}"
