"""The GPU sampler (wgsl/sample.wgsl) against its numpy twin (infr/cpu/sample.py):
the same token for many (seed, position) pairs over odd vocabularies, ties,
flat and peaked logits and every filter; the draws follow the filtered
softmax; the twin keeps infr/sampling.py's kept set."""

from __future__ import annotations

import numpy as np
import pytest

from infr.cpu import sample as ref
from infr.gpu import runtime
from infr.gpu.kernels_sample import StepSampling
from infr.gpu.runtime import storage
from infr.sampling import Sampler, SamplingParams


def gpu_draws(gpu, kernels, logits, params, seed, pos, rows=1, history=()):
    """Tokens the GPU sampler picks for positions pos .. pos + rows - 1 (one slot, `rows` draws)."""
    n = logits.size
    x = storage(gpu, np.asarray(logits, np.float32), label="test.logits")
    state = storage(gpu, np.array([pos - 1, 1, 0, 0], np.uint32), label="test.state")
    out = storage(gpu, 4 * rows, label="test.out")
    ss = StepSampling(kernels, n, max(len(history), pos) + 1, state, slots=1, rows=rows)
    runtime.run(gpu, ss.dispatches(x, out, ss.load([(0, 0, 0, params, seed, list(history))])))
    return runtime.read(gpu, out, np.uint32, rows).astype(np.int64)


def _vectors():
    rng = np.random.default_rng(1234)
    peaked = rng.normal(0, 2, 151_937).astype(np.float32)
    peaked[[17, 90_000, 151_936]] += 12.0
    flat = rng.normal(0, 0.05, 4_099).astype(np.float32)
    ties = np.round(rng.normal(0, 1, 3_001) * 2).astype(np.float32) / 2  # many exact ties
    ties[[5, 700, 2999]] = ties.max()  # a tie at the top too
    small = rng.normal(0, 3, 77).astype(np.float32)
    small[3] = -np.inf
    return {"peaked151k": peaked, "flat4099": flat, "ties3001": ties, "small77": small}


VECTORS = _vectors()
PARAMS = {
    "default": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    "top_p_only": SamplingParams(temperature=1.0, top_k=0, top_p=0.9, min_p=0.0),
    "top_k_only": SamplingParams(temperature=1.5, top_k=7, top_p=1.0, min_p=0.0),
    "min_p_only": SamplingParams(temperature=0.7, top_k=0, top_p=1.0, min_p=0.2),
    "none": SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
    "wide": SamplingParams(temperature=2.0, top_k=1000, top_p=0.5, min_p=0.01),
    # past kernels_sample.CAND_MAX: top_k by sample.wgsl's 4-bit radix rounds, with top_p and min_p
    "wider": SamplingParams(temperature=1.3, top_k=1500, top_p=0.9, min_p=0.001),
}


def test_top_k_takes_the_candidate_path(gpu, kernels):
    """top_k up to CAND_MAX: four 8-bit radix rounds, the collect pass and the
    pick over the sorted candidates (sample_topk.wgsl); past it, and without
    top_k, sample.wgsl's chain."""
    from infr.gpu import kernels_sample as KSA

    n = 5000
    x, out = storage(gpu, np.zeros(n, np.float32)), storage(gpu, 16)
    ss = StepSampling(kernels, n, 16, storage(gpu, 16), slots=2)
    labels = lambda *ps: [d.label.split()[0] for d in ss.dispatches(x, out, ss.load([(0, j, 0, p, 1, ()) for j, p in enumerate(ps)]))]
    assert labels(PARAMS["default"]) == ["sample_radix8"] * 4 + ["sample_collect", "sample_pick"]
    assert labels(SamplingParams(top_k=KSA.CAND_MAX)) == labels(PARAMS["default"])
    for p in (PARAMS["wider"], PARAMS["top_p_only"]):
        assert "sample_radix8" not in labels(p) and "sample_draw" in labels(p)
    # Rows of both paths in one step: each entry point runs once over both slots.
    both = labels(PARAMS["default"], PARAMS["top_p_only"])
    assert both == labels(PARAMS["default"]) + labels(PARAMS["top_p_only"])
    assert labels(PARAMS["top_p_only"]).count("sample_radix") == 8  # top_p's rounds only


def test_slots_of_one_step_draw_alone(gpu, kernels):
    """Many slots in one set of dispatches, mixed paths, penalties and positions: each slot's
    token is the twin's draw from its own row with its own settings."""
    rng = np.random.default_rng(3)
    n, S = 3001, 9
    logits = rng.normal(0, 2, (S, n)).astype(np.float32)
    history = rng.integers(0, n, 40).tolist()
    pen = SamplingParams(temperature=0.9, top_k=30, repeat_penalty=2.0, presence_penalty=1.0, repeat_last_n=16)
    params = [PARAMS[k] for k in PARAMS] + [pen, SamplingParams(temperature=0.0, frequency_penalty=3.0)]
    x = storage(gpu, logits.reshape(-1))
    out = storage(gpu, 4 * S)
    positions = np.array([5 + 3 * j for j in range(S)], np.uint32)
    state = storage(gpu, positions - 1)
    ss = StepSampling(kernels, n, 64, state, slots=S)
    rows = [(j, S - 1 - j, j, params[j], 100 + j, history[: int(positions[j])]) for j in range(S)]
    runtime.run(gpu, ss.dispatches(x, out, ss.load(rows)))
    got = runtime.read(gpu, out, np.uint32, S)[::-1].tolist()
    want = [ref.sample(logits[j], params[j], 100 + j, int(positions[j]), history[: int(positions[j])]) for j in range(S)]
    assert got == want


@pytest.mark.parametrize("vec", list(VECTORS))
@pytest.mark.parametrize("name", list(PARAMS))
def test_gpu_picks_the_reference_token(gpu, kernels, vec, name):
    x, p = VECTORS[vec], PARAMS[name]
    rows = 6 if x.size > 100_000 else 24
    picks = []
    for seed in (0, 7, 2**40 + 3):
        pos = 1 + seed % 1000
        got = gpu_draws(gpu, kernels, x, p, seed, pos, rows)
        want = [ref.sample(x, p, seed, pos + r) for r in range(rows)]
        assert got.tolist() == want, (vec, name, seed)
        picks += want
    if ref.kept(x, p).sum() > 1:
        assert len(set(picks)) > 1  # the seed and position matter


def test_kept_set_matches_host_sampler():
    # The twin keeps exactly infr/sampling.py's tokens (same chain, same ties rule).
    for vec, x in VECTORS.items():
        for name, p in PARAMS.items():
            ids, _ = Sampler(p, x.size).distribution(x)
            assert sorted(ids.tolist()) == np.flatnonzero(ref.kept(x, p)).tolist(), (vec, name)


def test_greedy_and_penalties(gpu, kernels):
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, 50_021).astype(np.float32)
    history = rng.integers(0, 50_021, 300).tolist()
    x[history[-5:]] += 6.0  # recent tokens lead until penalised
    for p in (
        SamplingParams(temperature=0, repeat_penalty=1.0),
        SamplingParams(temperature=0, repeat_penalty=4.0, repeat_last_n=64),
        SamplingParams(temperature=0, repeat_penalty=1.0, presence_penalty=3.0, frequency_penalty=1.0, repeat_last_n=-1),
        SamplingParams(temperature=0.9, top_k=20, repeat_penalty=1.3, frequency_penalty=0.5, repeat_last_n=100),
    ):
        for seed in (1, 99):
            got = gpu_draws(gpu, kernels, x, p, seed, len(history), rows=1, history=history)
            assert got[0] == ref.sample(x, p, seed, len(history), history), p
    greedy = gpu_draws(gpu, kernels, x, SamplingParams(temperature=0), 3, 10)[0]
    assert greedy == int(np.argmax(x))
    pen = SamplingParams(temperature=0, repeat_penalty=4.0, repeat_last_n=64)
    assert gpu_draws(gpu, kernels, x, pen, 3, len(history), history=history)[0] not in history[-5:]


@pytest.mark.parametrize("name", ["default", "top_p_only", "min_p_only"])
def test_draws_follow_filtered_softmax(gpu, kernels, name):
    # 20k draws (positions) in one dispatch: chi-square against the filtered softmax.
    rng = np.random.default_rng(11)
    x = (rng.normal(0, 1.5, 1_003)).astype(np.float32)
    p = PARAMS[name]
    probs = ref.probabilities(x, p)
    draws = gpu_draws(gpu, kernels, x, p, seed=2024, pos=1, rows=20_000)
    assert set(np.flatnonzero(np.bincount(draws, minlength=x.size))) <= set(np.flatnonzero(probs))
    counts = np.bincount(draws, minlength=x.size).astype(np.float64)
    chi2, dof = _chi_square(counts, probs)
    # mean dof, sd sqrt(2 dof): 6 sd is far beyond chance for a correct sampler
    assert chi2 < dof + 6 * np.sqrt(2 * dof), (chi2, dof)
    # ... and the test has the power to see a wrong temperature
    hot = ref.probabilities(x, SamplingParams(**{**p.__dict__, "temperature": p.temperature * 1.25}))
    wrong, wdof = _chi_square(counts, hot)
    assert wrong > wdof + 12 * np.sqrt(2 * wdof), (wrong, wdof)
    # total variation within twice its expected sampling noise, 0.5 * sum E|N_i/N - p_i|
    n = len(draws)
    tv = 0.5 * np.abs(counts / n - probs).sum()
    assert tv < 2 * 0.5 * np.sqrt(2 * probs * (1 - probs) / (np.pi * n)).sum(), tv


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    expected = probs * counts.sum()
    # Pool cells expected fewer than 5 times into one (chi-square's usual rule).
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    if (obs[~keep] > 0).any():
        return float("inf"), int(keep.sum()) - 1
    return float((((obs - exp) ** 2)[keep] / exp[keep]).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize("top_k,top_p", [(7, 1.0), (40, 1.0), (0, 0.3), (25, 0.6)])
def test_kept_set_with_ties_at_the_cut(gpu, kernels, top_k, top_p):
    # At a huge temperature every kept token is about equally likely: 3000 draws show the
    # GPU's kept set itself, including which of the tied values at the cut it keeps (lowest ids).
    x = VECTORS["ties3001"]
    p = SamplingParams(temperature=1e4, top_k=top_k, top_p=top_p, min_p=0.0)
    kept = np.flatnonzero(ref.kept(x, p))
    order = np.lexsort((np.arange(x.size), -x))
    cut_value = x[order[len(kept) - 1]]
    assert (x[kept] == cut_value).sum() < (x == cut_value).sum()  # the cut splits a group of ties
    draws = gpu_draws(gpu, kernels, x, p, seed=5, pos=1, rows=3000)
    assert set(draws.tolist()) == set(kept.tolist())
