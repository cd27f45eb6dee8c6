"""The chunked gated delta rule on the GPU (wgsl/deltanet_chunk_*.wgsl, kernels_deltanet.chunk_dispatches)
against the CPU reference (infr/cpu/deltanet.py), through the same conv / qknorm / norm dispatches
the token-serial rule has around it: several chunks with a partial last one, three slots interleaved
in one batch, then a second batch going on from the states the first left (a carried-in state), a
slot starting over at position 0 over a stale state, and the states read back; d_k 12, 16, 32, 128;
more rows than the row index scans in one block. End to end: tiny-qwen35's greedy tokens through the
engine (prompts of 45 to 150 tokens batched, the default selection) equal the CPU backend's, and
with every prompt batch chunked its logits follow the reference's; batched decode steps keep the
token-serial rule.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from infr import synth
from infr.gpu import kernels_deltanet as KDN
from infr.models.spec import DeltaNetSpec
from test_qwen35_gpu import _interleave, _Mixer, _pair

TINY = synth.PRESETS["tiny-qwen35"]


@pytest.fixture
def chunked(monkeypatch):
    """Every batch through the chunked rule (CHUNK_ROWS 1), the dispatches it took recorded."""
    taken = []
    real = KDN.chunk_dispatches

    def spy(*a, **kw):
        taken.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(KDN, "CHUNK_ROWS", 1)
    monkeypatch.setattr(KDN, "chunk_dispatches", spy)
    return taken


@pytest.mark.parametrize("m", [DeltaNetSpec(2, 6, 12, 12, 4), DeltaNetSpec(3, 6, 16, 16, 4),
                               DeltaNetSpec(1, 2, 32, 32, 4), DeltaNetSpec(1, 2, 128, 128, 4)],
                         ids=["hv6-hk2-dk12", "hv6-hk3-dk16", "hv2-hk1-dk32", "hv2-hk1-dk128"])
def test_chunked_rule_equals_the_reference(gpu, kernels, chunked, m):
    rng = np.random.default_rng(100 + m.d_k)
    mix = _Mixer(gpu, kernels, m, 5, rng, 128)
    # slot 3: 70 rows (chunks of 32, 32 and 6) beside two short prompts, interleaved
    pos, slots = _interleave([(3, 0, 70), (0, 0, 9), (4, 0, 1)])
    got, want = mix.step(pos, slots)
    # The chunked sums run in another order than the reference's token-serial ones (a 32x32
    # triangular solve, chunk-sized dot products): f32 rounding of the same size as the rule's, so
    # the token-serial rule's bound.
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    # on from where they stand (slot 3 mid-chunk at 70), slot 1 starts, slot 4 starts over at 0
    pos, slots = _interleave([(0, 9, 1), (3, 70, 40), (1, 0, 33), (4, 0, 2)])
    got, want = mix.step(pos, slots)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    assert len(chunked) == 2
    for s, at in ((0, 10), (1, 33), (3, 110), (4, 2)):  # the states read back: the reference's
        conv, S = mix.states(s)
        ref = mix.store.take(s, 0, at)
        np.testing.assert_allclose(conv, ref.conv, rtol=0, atol=1e-6)
        np.testing.assert_allclose(S, ref.S, rtol=0, atol=2e-4 * np.abs(ref.S).max())


def test_prompt_batches_take_the_chunked_rule():
    """The selection: batches of CHUNK_ROWS rows or more, d_k up to CHUNK_MAX_DK, a multiple of 4."""
    class K:
        class dev:
            limits = {"max-compute-workgroup-storage-size": 16384}

    assert KDN.can_chunk(K, DeltaNetSpec(16, 32, 128, 128, 4))
    assert not KDN.can_chunk(K, DeltaNetSpec(16, 32, 256, 256, 4))
    assert not KDN.can_chunk(K, DeltaNetSpec(1, 2, 5, 5, 3))  # the state pass reads vec4s
    assert KDN.CHUNK_ROWS > KDN.PRE_ROWS
    # by flavor, as measured (kernels_deltanet's comment): Dawn's token-serial rule wins longer
    flavor = lambda dawn: type("Dev", (), {"dawn": dawn})()  # noqa: E731
    assert (KDN.chunk_rows(flavor(False)), KDN.chunk_rows(flavor(True))) == (KDN.CHUNK_ROWS, KDN.CHUNK_ROWS_DAWN)
    assert KDN.CHUNK_ROWS_DAWN > KDN.CHUNK_ROWS


def test_the_tuning_knob_moves_the_chunked_rules_threshold(gpu, kernels, monkeypatch):
    """INFR_DELTANET_CHUNK_ROWS (tuning.deltanet_chunk_rows): 0 keeps every batch on the token-serial
    rule, a row count moves the threshold; read once, through the tuning object."""
    from infr.gpu import tuning

    m = DeltaNetSpec(1, 2, 16, 16, 4)
    mix = _Mixer(gpu, kernels, m, 2, np.random.default_rng(0), 128)
    kinds = lambda T: {d.label.split()[0] for d in KDN.rule_dispatches(  # noqa: E731
        kernels, mix.u, mix.o, mix.o, mix.o, mix.consts, mix.o, mix.o, mix.rstate, mix.o, mix.o, m, 1e-6, 2, T)}
    assert "deltanet_chunk_state" in kinds(KDN.CHUNK_ROWS) and "deltanet_rule" in kinds(KDN.CHUNK_ROWS - 1)
    for env, T, want in (("0", 100, "deltanet_rule"), ("40", 39, "deltanet_rule"), ("40", 40, "deltanet_chunk_state")):
        monkeypatch.setenv("INFR_DELTANET_CHUNK_ROWS", env)
        tuning.reload()
        assert want in kinds(T), (env, T)
    monkeypatch.delenv("INFR_DELTANET_CHUNK_ROWS")
    tuning.reload()


def test_tiny_qwen35_greedy_tokens_on_the_chunked_rule_equal_the_cpu_backend(gpu, tmp_path, monkeypatch):
    """Through the engine with the default selection: prompts of 45 to 150 tokens, batched (their
    prompt rows of several slots in one batch, chunked), then greedy decode: the CPU backend's tokens."""
    from infr.engine import Model
    from tests.engine_runs import greedy_outputs

    taken = []
    real = KDN.chunk_dispatches
    monkeypatch.setattr(KDN, "chunk_dispatches", lambda *a, **kw: taken.append(1) or real(*a, **kw))
    path = synth.write_gguf(replace(TINY, weight_type="F32"), tmp_path / "q35.gguf")
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, TINY.n_vocab, n).tolist() for n in (45, 150, 70)]
    on_gpu = greedy_outputs(Model(path, n_ctx=192, backend="gpu", parallel=3), prompts, 8)
    assert taken
    assert on_gpu == greedy_outputs(Model(path, n_ctx=192, backend="cpu", parallel=3), prompts, 8)


def test_tiny_qwen35_on_the_chunked_rule_follows_the_cpu_reference(gpu, chunked, tmp_path):
    from tests.closeness import assert_gpu_follows_cpu, assert_logits_close

    path = synth.write_gguf(replace(TINY, weight_type="F32"), tmp_path / "q35.gguf")
    g, c = _pair(path)
    prompt = np.random.default_rng(2).integers(0, TINY.n_vocab, 90).tolist()
    assert_logits_close(g.forward(prompt, 0, n_logits=64), c.forward(prompt, 0, n_logits=64), False)
    assert chunked
    assert_gpu_follows_cpu(g, c, prompt, 8)  # greedy tokens (decode steps on the token-serial rule)
    # a batched decode step (8 rows, each slot a few) keeps the token-serial rule whatever CHUNK_ROWS
    # says; the same rows as a prompt batch take the chunked one
    n = len(chunked)
    g._graph(8, 8, False, True)
    assert len(chunked) == n
    g._graph(8, 8, False, False)
    assert len(chunked) > n


def test_more_rows_than_one_index_block(gpu, kernels, chunked):
    """310 rows: deltanet_chunk_index scans them in two blocks of 256, each slot's count carried over."""
    m = DeltaNetSpec(1, 2, 16, 16, 4)
    mix = _Mixer(gpu, kernels, m, 4, np.random.default_rng(9), 320)
    pos, slots = _interleave([(3, 0, 200), (0, 0, 90), (1, 0, 20)])
    got, want = mix.step(pos, slots)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())
    for s, at in ((0, 90), (1, 20), (3, 200)):
        np.testing.assert_allclose(mix.states(s)[1], mix.store.take(s, 0, at).S, rtol=0,
                                   atol=2e-4 * np.abs(mix.store.take(s, 0, at).S).max())
