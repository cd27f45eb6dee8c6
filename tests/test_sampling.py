"""Sampler behaviour: each filter checked against its definition, draws checked empirically."""

import math

import numpy as np
import pytest

from infr.errors import InfrError
from infr.sampling import (
    Sampler,
    SamplingError,
    SamplingParams,
    apply_penalties,
    softmax,
    top_logprobs,
)

# Filters that are "off", so one setting can be tested on its own.
OFF = dict(top_k=0, top_p=1.0, min_p=0.0, temperature=1.0)


def random_logits(n, seed, scale=3.0):
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)


def logits_for(probs, n_vocab=None, seed=0):
    """float32 logits whose softmax is `probs`, scattered over a vocab whose other ids are -inf."""
    probs = np.asarray(probs, dtype=np.float64)
    n_vocab = n_vocab or probs.size
    ids = np.random.default_rng(seed).permutation(n_vocab)[: probs.size]
    x = np.full(n_vocab, -np.inf, dtype=np.float32)
    x[ids] = np.log(probs)
    return x, ids


def draw(sampler, logits, n, history=()):
    return np.array([sampler.sample(logits, history) for _ in range(n)])


# ---------------------------------------------------------------- greedy / seeds


def test_greedy_is_argmax():
    for seed in range(5):
        x = random_logits(5000, seed)
        s = Sampler(SamplingParams(temperature=0.0), 5000)
        assert s.sample(x) == int(np.argmax(x))
        assert Sampler(SamplingParams(temperature=-1.0), 5000).sample(x) == int(np.argmax(x))


def test_greedy_is_argmax_after_penalties():
    x = np.array([1.0, 5.0, 4.0, -2.0], dtype=np.float32)
    params = SamplingParams(temperature=0.0, repeat_penalty=2.0)
    s = Sampler(params, 4)
    assert s.sample(x, history=[]) == 1
    # 5/2 = 2.5 < 4: the repeated token loses to the next best one.
    assert s.sample(x, history=[1]) == 2
    assert s.sample(x, history=[1]) == int(np.argmax(apply_penalties(x, [1], params)))


def test_same_seed_same_sequence_different_seed_differs():
    x = random_logits(1000, 1, scale=0.5)  # flat enough that draws vary a lot
    params = dict(OFF, seed=1234)
    a = draw(Sampler(SamplingParams(**params), 1000), x, 50)
    b = draw(Sampler(SamplingParams(**params), 1000), x, 50)
    c = draw(Sampler(SamplingParams(**dict(params, seed=4321)), 1000), x, 50)
    assert len(set(a.tolist())) > 10
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # reset() restarts the stream.
    s = Sampler(SamplingParams(**params), 1000)
    first = draw(s, x, 50)
    s.reset()
    assert np.array_equal(draw(s, x, 50), first)


def test_seed_none_is_random():
    x = random_logits(1000, 2, scale=0.5)
    a = draw(Sampler(SamplingParams(**OFF), 1000), x, 50)
    b = draw(Sampler(SamplingParams(**OFF), 1000), x, 50)
    assert not np.array_equal(a, b)


# ---------------------------------------------------------------- top_k


def test_top_k_1_is_greedy():
    for seed in range(5):
        x = random_logits(20000, seed)
        s = Sampler(SamplingParams(**dict(OFF, top_k=1, seed=seed)), 20000)
        assert all(s.sample(x) == int(np.argmax(x)) for _ in range(20))


def test_top_k_restricts_support():
    n, k = 3000, 7
    x = random_logits(n, 3, scale=0.3)
    s = Sampler(SamplingParams(**dict(OFF, top_k=k, seed=5)), n)
    seen = set(draw(s, x, 2000).tolist())
    assert seen == set(np.argsort(-x)[:k].tolist())


def test_top_k_ties_at_the_boundary_are_broken_by_lower_id():
    x = np.array([0.0, 1.0, 1.0, 1.0, 3.0, 1.0], dtype=np.float32)
    ids, _ = Sampler(SamplingParams(**dict(OFF, top_k=3)), 6).distribution(x)
    assert ids.tolist() == [4, 1, 2]


# ---------------------------------------------------------------- top_p / min_p


@pytest.mark.parametrize("top_k", [0, 40])  # full-vocab path and after-top_k path
@pytest.mark.parametrize(
    "top_p, n_kept", [(0.45, 1), (0.75, 2), (0.9, 3), (1.0, 4)]
)
def test_top_p_keeps_the_minimal_nucleus(top_k, top_p, n_kept):
    probs = [0.5, 0.3, 0.15, 0.05]
    x, ids = logits_for(probs, n_vocab=500)
    s = Sampler(SamplingParams(**dict(OFF, top_k=top_k, top_p=top_p, seed=7)), 500)
    kept, p = s.distribution(x)
    got = {int(i): float(q) for i, q in zip(kept, p) if q > 0}
    # Renormalised over the nucleus; every other id has zero probability.
    expect = np.array(probs[:n_kept]) / sum(probs[:n_kept])
    assert sorted(got) == sorted(ids[:n_kept].tolist())
    assert np.allclose([got[int(i)] for i in ids[:n_kept]], expect, atol=1e-6)
    assert set(draw(s, x, 1000).tolist()) == set(ids[:n_kept].tolist())


def test_top_p_on_a_wide_vocab_matches_sorted_cumsum():
    # Mass spread over thousands of tokens: the nucleus is longer than the
    # first prefix the sampler sorts, so the prefix has to grow.
    n = 50000
    x = random_logits(n, 11, scale=1.0)
    order = np.argsort(-x.astype(np.float64), kind="stable")
    cum = np.cumsum(softmax(x)[order])
    for top_p in (0.3, 0.9):
        expect = order[: np.searchsorted(cum, top_p) + 1]
        assert expect.size > 256
        kept, _ = Sampler(SamplingParams(**dict(OFF, top_p=top_p)), n).distribution(x)
        assert kept.tolist() == expect.tolist()


@pytest.mark.parametrize("top_k", [0, 40])
def test_min_p_drops_tokens_below_min_p_times_max(top_k):
    probs = np.array([0.4, 0.3, 0.2, 0.06, 0.04])
    x, ids = logits_for(probs, n_vocab=300, seed=3)
    s = Sampler(SamplingParams(**dict(OFF, top_k=top_k, min_p=0.125, seed=9)), 300)
    # 0.125 * 0.4 = 0.05: 0.06 stays, 0.04 goes.
    want = ids[:4]
    kept, p = s.distribution(x)
    assert kept.tolist() == want.tolist()
    assert np.allclose(p, probs[:4] / probs[:4].sum(), atol=1e-6)
    assert set(draw(s, x, 2000).tolist()) == set(want.tolist())


def test_min_p_on_a_wide_vocab():
    n = 50000
    x = random_logits(n, 12, scale=2.0)
    pr = softmax(x)
    for min_p in (0.5, 0.01):
        kept, _ = Sampler(SamplingParams(**dict(OFF, min_p=min_p)), n).distribution(x)
        assert set(kept.tolist()) == set(np.flatnonzero(pr >= min_p * pr.max() * (1 - 1e-6)).tolist())


def test_filters_run_before_temperature():
    # llama.cpp order: top_p/min_p see the untempered distribution. At a high
    # temperature the tail would pass min_p if temperature came first.
    probs = np.array([0.7, 0.2, 0.1])
    x, ids = logits_for(probs)
    kept, _ = Sampler(SamplingParams(**dict(OFF, min_p=0.2, temperature=5.0)), 3).distribution(x)
    assert kept.tolist() == ids[:2].tolist()


# ---------------------------------------------------------------- temperature


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_frequencies_match_softmax(temperature):
    n_draws = 20000
    x = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -1.5], dtype=np.float32)
    z = x.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    s = Sampler(SamplingParams(**dict(OFF, temperature=temperature, seed=2024)), x.size)
    freq = np.bincount(draw(s, x, n_draws), minlength=x.size) / n_draws
    # 5 binomial standard deviations per token: a correct sampler fails this
    # with probability ~1e-6, a wrong temperature (e.g. ignored) fails it by far.
    tol = 5 * np.sqrt(p * (1 - p) / n_draws)
    assert np.all(np.abs(freq - p) <= tol), (freq, p, tol)


# ---------------------------------------------------------------- penalties


def penalised_reference(x, history, rp, last_n, freq, pres):
    """The llama.cpp formulas, one token at a time."""
    window = list(history) if last_n < 0 else (list(history[-last_n:]) if last_n > 0 else [])
    out = [float(v) for v in x]
    for tok in set(window):
        c = window.count(tok)
        v = out[tok]
        v = v * rp if v <= 0 else v / rp
        out[tok] = v - (c * freq + (1.0 if c > 0 else 0.0) * pres)
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize(
    "rp, last_n, freq, pres",
    [
        (1.3, 64, 0.0, 0.0),
        (1.0, 64, 0.5, 0.0),
        (1.0, 64, 0.0, 0.7),
        (1.2, 5, 0.25, 0.4),  # window shorter than the history
        (1.2, -1, 0.25, 0.4),  # whole history
        (0.8, 64, -0.3, -0.2),  # penalties below 1 / negative reward repeats
    ],
)
def test_penalties_follow_the_formulas(rp, last_n, freq, pres):
    x = random_logits(100, 21)
    history = [3, 7, 3, 3, 50, 7, 99, 0, 42, 3, 42, 11]
    params = SamplingParams(repeat_penalty=rp, repeat_last_n=last_n, frequency_penalty=freq, presence_penalty=pres)
    before = x.copy()
    got = apply_penalties(x, history, params)
    assert np.array_equal(x, before)  # input untouched
    assert np.allclose(got, penalised_reference(x, history, rp, last_n, freq, pres), rtol=1e-6, atol=1e-6)
    assert not np.allclose(got, x)


def test_repeat_penalty_sign_rule_and_window():
    x = np.array([2.0, -2.0, 0.0, 3.0], dtype=np.float32)
    got = apply_penalties(x, [3, 0, 1, 2], SamplingParams(repeat_penalty=2.0, repeat_last_n=3))
    # Token 3 is outside the last 3; positive logits halve, negative ones double.
    assert got.tolist() == [1.0, -4.0, 0.0, 3.0]


def test_penalties_off_leave_logits_alone():
    x = random_logits(50, 22)
    for params in (
        SamplingParams(),  # llama.cpp defaults: all penalties neutral
        SamplingParams(repeat_penalty=1.5, repeat_last_n=0),  # window off
    ):
        assert np.array_equal(apply_penalties(x, [1, 2, 3, 1], params), x)


def test_penalties_steer_sampling():
    # A heavy presence penalty on the two favourite tokens must move all draws elsewhere.
    x = np.array([5.0, 4.9, 0.0, -0.1], dtype=np.float32)
    s = Sampler(SamplingParams(**dict(OFF, presence_penalty=100.0, seed=1)), 4)
    assert set(draw(s, x, 300, history=[0, 1]).tolist()) == {2, 3}


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("top_k", -1, "top_k must be >= 0"),
        ("top_p", 0.0, "top_p must be in (0, 1]"),
        ("top_p", 1.5, "top_p must be in (0, 1]"),
        ("min_p", -0.1, "min_p must be in [0, 1]"),
        ("min_p", 1.1, "min_p must be in [0, 1]"),
        ("repeat_penalty", 0.0, "repeat_penalty must be > 0"),
        ("repeat_last_n", -2, "repeat_last_n must be >= -1"),
        ("temperature", float("nan"), "temperature must be a finite number"),
        ("presence_penalty", float("inf"), "presence_penalty must be a finite number"),
        ("top_k", 2.5, "top_k must be an integer"),
        ("seed", -5, "seed must be a non-negative integer"),
    ],
)
def test_invalid_params_give_a_one_line_error(field, value, needle):
    params = SamplingParams(**{field: value})
    with pytest.raises(SamplingError) as e:
        params.validate()
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert isinstance(e.value, InfrError)
    with pytest.raises(SamplingError):
        Sampler(params, 10)


def test_valid_params_pass():
    SamplingParams().validate()
    SamplingParams(temperature=0, top_k=0, top_p=1.0, min_p=0.0, repeat_last_n=-1, seed=0).validate()


def test_nan_and_inf_logits_are_errors_not_crashes():
    s = Sampler(SamplingParams(), 4)
    with pytest.raises(SamplingError, match="NaN"):
        s.sample(np.array([0.0, np.nan, 1.0, 2.0], dtype=np.float32))
    with pytest.raises(SamplingError, match=r"\+inf"):
        s.sample(np.array([0.0, np.inf, 1.0, 2.0], dtype=np.float32))
    with pytest.raises(SamplingError, match="every logit is -inf"):
        s.sample(np.full(4, -np.inf, dtype=np.float32))
    with pytest.raises(SamplingError, match="shape"):
        s.sample(np.zeros(5, dtype=np.float32))
    with pytest.raises(SamplingError, match="outside the vocabulary"):
        Sampler(SamplingParams(repeat_penalty=1.1), 4).sample(np.zeros(4, dtype=np.float32), history=[1, 9])


@pytest.mark.parametrize("top_k", [0, 40])
def test_minus_inf_tokens_are_never_drawn(top_k):
    # Only 3 finite tokens in a vocab larger than top_k: masked ones stay out.
    x = np.full(100, -np.inf, dtype=np.float32)
    x[[5, 17, 80]] = [0.0, 0.1, -0.1]
    s = Sampler(SamplingParams(**dict(OFF, top_k=top_k, seed=3)), 100)
    assert set(draw(s, x, 500).tolist()) == {5, 17, 80}


# ---------------------------------------------------------------- softmax / logprobs


def test_softmax_is_stable_for_large_logits():
    p = softmax(np.array([1000.0, 1001.0, -np.inf], dtype=np.float32))
    assert np.allclose(p, [1 / (1 + math.e), math.e / (1 + math.e), 0.0])


def test_top_logprobs():
    x = random_logits(1000, 31)
    got = top_logprobs(x, 5)
    order = np.argsort(-x)[:5]
    assert [i for i, _ in got] == order.tolist()
    assert np.allclose([lp for _, lp in got], np.log(softmax(x)[order]), atol=1e-5)
    # Masked tokens are left out rather than reported as -inf.
    y = np.full(10, -np.inf, dtype=np.float32)
    y[[2, 6]] = [0.0, 0.0]
    assert top_logprobs(y, 5) == [(2, math.log(0.5)), (6, math.log(0.5))]
    assert top_logprobs(x, 0) == []
