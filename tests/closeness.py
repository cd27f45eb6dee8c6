"""How close two computations of one model's logits must be (batch vs token by
token, GPU vs CPU reference).

float32 sums in another order: ~1e-2 on logits of ~20. With Q4_K matmuls the
activations are rounded to 8 bits (infr.numerics.Q8_ACTIVATIONS): a 1e-7
difference upstream that crosses a half step moves one value by a whole step,
so the two differ by sparse jumps, about 1 % RMS of the logits (Gemma-3 270M,
one prompt, batch vs steps: max 0.29, RMS 0.053 of 5.1). Callers also compare
the argmax, which is what generation uses.
"""

from __future__ import annotations

import numpy as np

from infr.numerics import Q8_ACTIVATIONS
from infr.ops import MatMul


def rounds_activations(gf, plan) -> bool:
    return any(isinstance(op, MatMul) and gf.tensor(op.weight).qtype in Q8_ACTIVATIONS for op in plan.ops)


def assert_logits_close(got: np.ndarray, want: np.ndarray, q8: bool) -> None:
    if not q8:
        np.testing.assert_allclose(got, want, atol=5e-2, rtol=0)
        return
    diff = np.abs(got - want)
    rms = float(np.sqrt(np.mean(np.square(got - want))))
    scale = float(np.sqrt(np.mean(np.square(want))))
    assert diff.max() < 0.6, f"max logit difference {diff.max():.3g}"
    assert rms < 0.02 * scale, f"RMS difference {rms:.3g} vs RMS logits {scale:.3g}"
