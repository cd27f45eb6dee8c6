"""qwen35 (gated DeltaNet + gated attention) on the CPU reference: the family's metadata and its
errors, the plan's per-layer mixers and state, the recurrence against a direct transcription
of wave2-families.md section 2.3, and a tiny synthetic model through the engine."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from infr import synth
from infr.cpu.backend import CPUBackend
from infr.cpu.deltanet import RecurrentStore, deltanet_forward
from infr.errors import GGUFError, InfrError
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.models.spec import DeltaNetSpec, RopeStyle
from infr.ops import DeltaNet, HeadSlice, MatMul, SigmoidMul
from infr.plan import KVState, RecurrentState, build_plan

TINY = synth.PRESETS["tiny-qwen35"]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return synth.write_gguf(TINY, tmp_path_factory.mktemp("q35") / "tiny-qwen35.gguf")


# ---------------------------------------------------------------- spec, plan, metadata


def test_spec_and_plan_of_the_tiny_model(tiny_path):
    spec = build_spec(open_gguf(tiny_path))
    # full_attention_interval 2: layers 0 and 2 DeltaNet, 1 and 3 gated attention
    assert [la.mixer is not None for la in spec.layers] == [True, False, True, False]
    assert spec.layers[0].mixer == DeltaNetSpec(n_k_heads=2, n_v_heads=4, d_k=16, d_v=16, d_conv=4)
    a = spec.layers[1].attention
    assert a.output_gate and a.qk_norm and a.rope.style is RopeStyle.IMROPE and a.rope.n_rot == 8
    assert a.rope.sections == (2, 1, 1, 0)
    plan = build_plan(spec)
    assert [type(st) for st in plan.state] == [RecurrentState, KVState, RecurrentState, KVState]
    assert [st.layer for st in plan.kv] == [1, 3] and [st.layer for st in plan.recurrent] == [0, 2]
    # per sequence per DeltaNet layer: 3 conv rows of conv_dim 128, 4 heads of 16 x 16, f32
    assert plan.recurrent_bytes_per_sequence == 2 * 4 * (3 * 128 + 4 * 16 * 16)
    assert plan.kv_bytes_per_token() == 2 * 2 * 2 * (32 + 32)  # KV only on the two attention layers
    assert plan.cpu_only == ()  # both run on the GPU too (tests/gpu/test_qwen35_gpu.py)
    q = next(op for op in plan.layers if isinstance(op, MatMul) and op.weight == "blk.1.attn_q.weight")
    assert q.n_out == 2 * 4 * 32  # [q_h | gate_h] per head
    assert any(isinstance(op, SigmoidMul) for op in plan.layers)
    assert sum(isinstance(op, DeltaNet) for op in plan.layers) == 2
    assert "blk.0.post_attention_norm.weight" in plan.weights() and "blk.0.ssm_a" in plan.weights()
    assert not any("ffn_norm" in w for w in plan.weights())


def test_recurrent_layers_array_wins_over_the_interval(tmp_path):
    spec = replace(TINY, n_layers=4, recurrent_layers=(True, True, False, True))
    gf = open_gguf(synth.write_gguf(spec, tmp_path / "m.gguf"))
    assert [la.mixer is not None for la in build_spec(gf).layers] == [True, True, False, True]
    gf.metadata["qwen35.full_attention_interval"] = 2  # ignored while the array is there
    assert [la.mixer is not None for la in build_spec(gf).layers] == [True, True, False, True]


@pytest.mark.parametrize("change,message", [
    (lambda m: m.pop("qwen35.ssm.state_size"), "missing metadata key 'qwen35.ssm.state_size'"),
    (lambda m: m.pop("qwen35.rope.dimension_sections"), "rope.dimension_sections"),
    (lambda m: m.__setitem__("qwen35.rope.dimension_sections", [2, 1, 1]), "must be 4 counts"),
    (lambda m: m.__setitem__("qwen35.ssm.group_count", 3), "not a multiple of ssm.group_count"),
    (lambda m: m.__setitem__("qwen35.ssm.inner_size", 4 * 8), "d_k == d_v"),
    (lambda m: m.__setitem__("qwen35.ssm.inner_size", 66), "not a multiple of ssm.time_step_rank"),
    (lambda m: m.__setitem__("qwen35.full_attention_interval", 0), "must be positive"),
    (lambda m: m.__setitem__("qwen35.attention.recurrent_layers", [True, False]), "one bool per layer"),
    (lambda m: m.__setitem__("qwen35.rope.dimension_count", 7), "must be even"),
])
def test_malformed_metadata_is_a_clear_error(tiny_path, change, message):
    gf = open_gguf(tiny_path)
    change(gf.metadata)
    with pytest.raises(GGUFError, match=message):
        build_spec(gf)


def test_a_tensor_of_the_wrong_shape_is_refused_at_load(tiny_path):
    gf = open_gguf(tiny_path)
    gf.metadata["qwen35.ssm.conv_kernel"] = 3  # the file's conv has 4 taps
    with pytest.raises(InfrError, match="ssm_conv1d"):
        CPUBackend(gf, build_plan(build_spec(gf)), 32)


def test_head_slice_takes_interleaved_q_and_gate():
    from infr.cpu.kinds import compile_op

    x = np.arange(2 * 3 * 8, dtype=np.float32).reshape(2, 24)  # 3 heads of [q (4) | gate (4)]
    env = {"qg": x}
    compile_op(None, HeadSlice("q", "qg", 3, 4, 0))(env, None, None)
    compile_op(None, HeadSlice("gate", "qg", 3, 4, 1))(env, None, None)
    assert env["q"][0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert env["gate"][1].tolist() == [28, 29, 30, 31, 36, 37, 38, 39, 44, 45, 46, 47]


# ---------------------------------------------------------------- the recurrence


def _direct(m: DeltaNetSpec, qkv, z, beta, alpha, conv_w, dt_bias, a, norm_w, eps, grouped=False):
    """wave2-families.md section 2.3, token by token, in float64, one V-head at a time."""
    hk, hv, dk, dv, dc = m.n_k_heads, m.n_v_heads, m.d_k, m.d_v, m.d_conv
    state = np.zeros((dc - 1, m.conv_dim))
    S = np.zeros((hv, dk, dv))
    out = []
    for t in range(len(qkv)):
        X = np.vstack([state, qkv[t]])
        c = sum(X[j] * conv_w[:, j] for j in range(dc))
        state = X[1:]
        u = c / (1 + np.exp(-c))
        q, k, v = u[: hk * dk].reshape(hk, dk), u[hk * dk: 2 * hk * dk].reshape(hk, dk), u[2 * hk * dk:].reshape(hv, dv)
        q = q / np.sqrt((q * q).sum(1, keepdims=True) + eps)
        k = k / np.sqrt((k * k).sum(1, keepdims=True) + eps)
        b = 1 / (1 + np.exp(-beta[t]))
        g = np.log1p(np.exp(alpha[t] + dt_bias)) * a
        o = np.zeros((hv, dv))
        for h in range(hv):
            j = h // (hv // hk) if grouped else h % hk
            S[h] *= np.exp(g[h])
            delta = b[h] * (v[h] - S[h].T @ k[j])
            S[h] += np.outer(k[j], delta)
            o[h] = S[h].T @ q[j] / np.sqrt(dk)
        zt = z[t].reshape(hv, dv)
        o = o / np.sqrt((o * o).mean(1, keepdims=True) + eps) * norm_w * (zt / (1 + np.exp(-zt)))
        out.append(o.reshape(-1))
    return np.array(out)


def _random_inputs(m: DeltaNetSpec, t: int, seed: int):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    return dict(qkv=f(t, m.conv_dim), z=f(t, m.n_v_heads * m.d_v), beta=f(t, m.n_v_heads), alpha=f(t, m.n_v_heads),
                conv_w=f(m.conv_dim, m.d_conv) * np.float32(0.5), dt_bias=f(m.n_v_heads),
                a=-np.exp(f(m.n_v_heads)), norm_w=1 + f(m.d_v) * np.float32(0.2), eps=1e-6)


def _run(m, store, x, pos, slots, rows=slice(None)):
    return deltanet_forward(m, x["qkv"][rows], x["z"][rows], x["beta"][rows], x["alpha"][rows], pos, slots, store, 0,
                            x["conv_w"], x["dt_bias"], x["a"], x["norm_w"], x["eps"])


def test_recurrence_is_the_formulas_token_by_token_and_the_grouped_mapping_is_not():
    m = DeltaNetSpec(n_k_heads=2, n_v_heads=6, d_k=8, d_v=8, d_conv=4)
    x = _random_inputs(m, 11, seed=1)
    got = _run(m, RecurrentStore({0: m}), x, np.arange(11), np.zeros(11, np.int64))
    want = _direct(m, **x)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    grouped = _direct(m, **x, grouped=True)  # the negative control: V-head h on K-head h // 3
    assert np.abs(grouped - want).max() > 1e-2


def test_state_carried_across_chunks_equals_one_pass_and_slots_are_independent():
    m = DeltaNetSpec(n_k_heads=1, n_v_heads=2, d_k=8, d_v=8, d_conv=3)
    x, y = _random_inputs(m, 9, seed=2), _random_inputs(m, 9, seed=3)
    y.update({k: x[k] for k in ("conv_w", "dt_bias", "a", "norm_w")})  # one layer's weights, two sequences
    one = _run(m, RecurrentStore({0: m}), x, np.arange(9), np.zeros(9, np.int64))
    store = RecurrentStore({0: m})
    first = _run(m, store, x, np.arange(4), np.zeros(4, np.int64), slice(0, 4))
    # the second chunk shares its step with another sequence's whole prompt (slot 1)
    both = {k: (np.concatenate([x[k][4:], y[k]]) if k in ("qkv", "z", "beta", "alpha") else x[k]) for k in x}
    rest = _run(m, store, both, np.concatenate([np.arange(4, 9), np.arange(9)]),
                np.array([0] * 5 + [1] * 9))
    np.testing.assert_array_equal(np.vstack([first, rest[:5]]), one)
    np.testing.assert_array_equal(rest[5:], _run(m, RecurrentStore({0: m}), y, np.arange(9), np.zeros(9, np.int64)))
    # a sequence that skips positions (a prefix it never computed) is refused, not computed wrong
    with pytest.raises(InfrError, match="cannot skip or rewind"):
        _run(m, store, x, np.arange(5, 7), np.zeros(2, np.int64), slice(0, 2))
    with pytest.raises(InfrError, match="stands at none"):
        _run(m, store, x, np.arange(3, 5), np.full(2, 7), slice(0, 2))
    # position 0 starts the slot afresh
    again = _run(m, store, x, np.arange(9), np.zeros(9, np.int64))
    np.testing.assert_array_equal(again, one)


# ---------------------------------------------------------------- end to end


def test_prompt_in_chunks_gives_one_passes_logits(tiny_path):
    gf = open_gguf(tiny_path)
    plan = build_plan(build_spec(gf))
    rng = np.random.default_rng(6)
    ids = rng.integers(2, 512, 23).tolist()
    one = CPUBackend(gf, plan, 64).forward(ids, 0, n_logits=23)
    be = CPUBackend(gf, plan, 64)
    parts = [be.forward(ids[a:b], a, n_logits=b - a) for a, b in ((0, 5), (5, 17), (17, 23))]
    np.testing.assert_array_equal(np.vstack(parts), one)  # prompt rows: the same sums, the state carried exactly
    assert np.isfinite(one).all() and one.std() > 0.1
    # A chunk of one token past position 0 goes the decode path (one row alone, another summation
    # order), ~1e-6 off in its projections; the state carries that on, so later rows are only close.
    be = CPUBackend(gf, plan, 64)
    parts = [be.forward(ids[a:b], a, n_logits=b - a) for a, b in ((0, 5), (5, 6), (6, 17), (17, 23))]
    np.testing.assert_array_equal(parts[0], one[:5])
    np.testing.assert_allclose(np.vstack(parts), one, rtol=0, atol=2e-3)


@pytest.mark.parametrize("preset,weight_type", [("tiny-qwen35", "F32"), ("tiny-qwen35moe", "Q8_0")])
def test_batched_equals_alone_through_the_engine(tmp_path, preset, weight_type):
    """Five greedy requests of different lengths share the engine's steps, each row reading and
    writing its own sequence's recurrent state (and, qwen35moe, routed to its own experts), and give
    exactly the tokens each gives alone."""
    from infr.engine import Model
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    path = synth.write_gguf(replace(synth.PRESETS[preset], weight_type=weight_type), tmp_path / "m.gguf")
    rng = np.random.default_rng(4)
    prompts = [rng.integers(2, 512, n).tolist() for n in (3, 9, 17, 40, 70)]
    model = Model(path, n_ctx=100, backend="cpu", parallel=5, kv_tokens=5 * 100)
    greedy = SamplingParams(temperature=0.0)

    def run(ps, **kw):
        reqs = [model.engine.submit(Request(list(p), greedy, max_new=8, **kw)) for p in ps]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        return [r.output for r in reqs]

    alone = [run([p], cache_prompt=False)[0] for p in prompts]
    stats = model.engine.stats
    steps, rows = stats.steps, stats.rows
    assert run(prompts, cache_prompt=False) == alone
    assert stats.steps - steps < (stats.rows - rows) / 4  # they did share steps
    assert sum(len(out) for out in alone) > len(prompts)


def test_no_prefix_reuse_without_checkpoints_and_preemption_recomputes(tiny_path):
    """The recurrent state cannot be restored from KV blocks: without checkpoints (checkpoints=0) a
    request whose prompt the prefix cache holds still computes every position (the same tokens as a
    cold run), and requests preempted for blocks recompute from position 0 and give the tokens they
    give with room. (With checkpoints: tests/test_qwen35_checkpoints.py.)"""
    from infr.engine import Model
    from infr.sampling import SamplingParams
    from infr.scheduler import Request

    rng = np.random.default_rng(8)
    shared = rng.integers(2, 512, 48).tolist()
    prompts = [shared + rng.integers(2, 512, n).tolist() for n in (12, 14, 10)]  # 2 blocks of 32 each
    greedy = SamplingParams(temperature=0.0)

    def run(model, ps, **kw):
        reqs = [model.engine.submit(Request(list(p), greedy, max_new=16, **kw)) for p in ps]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.finish_reason != "error" for r in reqs), [r.error for r in reqs]
        return [r.output for r in reqs]

    model = Model(tiny_path, n_ctx=100, backend="cpu", parallel=3, kv_tokens=3 * 100, checkpoints=0)
    cold = [run(model, [p], cache_prompt=False)[0] for p in prompts]
    assert [run(model, [p])[0] for p in prompts] == cold  # the second and third share 48 tokens with the first
    assert model.engine.stats.prefix_hit_tokens == 0
    # 5 blocks: two prompts fit, then both grow into a third block and one is preempted
    small = Model(tiny_path, n_ctx=100, backend="cpu", parallel=3, kv_tokens=160, checkpoints=0)
    assert run(small, prompts) == cold
    assert small.engine.stats.preemptions > 0 and small.engine.stats.prefix_hit_tokens == 0


def test_session_extends_in_place_and_recomputes_a_rewound_prefix(tiny_path):
    """Session.decode goes on from the recurrent state where it stands; a prefill that rewinds
    (a shorter common prefix) cannot restore the state and computes the sequence from position 0."""
    from infr.engine import Model

    model = Model(tiny_path, n_ctx=128, backend="cpu")
    alone = CPUBackend(model.gguf, model.plan, 128)
    ids = np.random.default_rng(9).integers(2, 512, 70).tolist()
    s = model.session()
    np.testing.assert_array_equal(s.prefill(ids), alone.forward(ids, 0)[-1])
    before = s.stats.reused_tokens
    s.decode(7)
    assert s.stats.reused_tokens - before == 70  # went on from position 70
    before = s.stats.reused_tokens
    again = s.prefill(ids[:50] + [7, 8])
    assert s.stats.reused_tokens == before  # nothing reused: computed from position 0
    np.testing.assert_array_equal(again, alone.forward(ids[:50] + [7, 8], 0)[-1])

