"""gemma4's table GELU (Activation.GELU_F16) in the GEMV's fused gate||up pair (wgsl/gemv.wgsl with
wgsl/gelu_f16.wgsl), dense and over expert banks: word for word what the unfused dispatches give
(gate and up as two GEMVs, then gemma4.wgsl's gated_gelu_f16), since the table GELU jumps between
f16 steps and a last-bit difference in the activation can move a whole step. Odd shapes: rows not a
multiple of a workgroup's 8, one and several tokens, one type and two. The int8 GEMM's pair (prompt
batches, gemm_mmq.wgsl) likewise; the tensor cores' pair refuses it. End to end: tiny gemma4 models
whose FFNs and experts take the pairs decode as the CPU reference does."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from infr import synth
from infr.cpu import ops as F
from infr.cpu.backend import CPUBackend
from infr.errors import UnsupportedError
from infr.gguf_file import open_gguf
from infr.gpu import kernels_gemma4 as KG4
from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_misc as KS
from infr.gpu import kernels_mma as KMA
from infr.gpu import kernels_mmq as KMQ
from infr.gpu import kernels_moe as KMoE
from infr.gpu import kernels_q8 as KQ
from infr.gpu.backend import GPUBackend
from infr.gpu.runtime import read, run, storage
from infr.models import build_spec
from infr.models.spec import Activation
from infr.numerics import matmul_input
from infr.plan import build_plan
from tests.closeness import assert_follows_greedy

from test_moe_gpu import _bank, _pairs, _u32  # tests/gpu is on sys.path (pytest's prepend import mode)
from test_quant_kernels import make_weight, reference

GELU = Activation.GELU_F16


def _words(gpu, buf, n: int) -> np.ndarray:
    return read(gpu, buf, np.float32, n).view(np.uint32)


def _nan(gpu, n: int):
    return storage(gpu, np.full(n, np.nan, np.float32))


def _x(rng, T: int, K: int, w) -> np.ndarray:
    """Rows of several magnitudes for the gate matrix w's rows (raw GGUF bytes of any shape ending in K),
    so the gates' spread is 12 down to 2: inside the table's +-10 and past it."""
    W = np.asarray(dequantize(np.asarray(w.raw), w.qtype), np.float64).reshape(-1, K)
    rms = np.sqrt(np.mean(np.sum(W * W, axis=1)))
    return (rng.standard_normal((T, K)) * np.linspace(12, 2, T)[:, None] / rms).astype(np.float32)


def _table_range(g: np.ndarray) -> None:
    """The test's gates reach both the table and (some) its ends, else it proves little."""
    assert (np.abs(g) < 10).mean() > 0.3 and (np.abs(g) >= 10).any(), (np.abs(g) < 10).mean()


# (gate type, up type, N, K, T): N = 37 / 21: a part-full last workgroup; T = 1: decode, 3 and 9: a
# workgroup of several tokens, and more than one workgroup of them (GemvTuning.NT = 8)
DENSE = [(Q.Q4_K, Q.Q4_K, 37, 512, 1), (Q.Q6_K, Q.Q6_K, 37, 256, 3), (Q.Q8_0, Q.Q8_0, 21, 320, 9),
         (Q.Q4_K, Q.Q6_K, 21, 256, 1), (Q.Q5_0, Q.Q8_0, 37, 192, 3)]


@pytest.mark.parametrize("qg,qu,N,K,T", DENSE, ids=lambda v: getattr(v, "name", str(v)).lower())
def test_dense_pair_equals_gate_up_then_table_gelu(gpu, kernels, qg, qu, N, K, T):
    rng = np.random.default_rng([int(qg), int(qu), N, K, T])
    wg, wu = make_weight(qg, N, K, rng), make_weight(qu, N, K, rng)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    x = storage(gpu, _x(rng, T, K, wg))
    fused = _nan(gpu, T * N)
    ds = KM.gate_up_dispatches(kernels, wg, wu, cg, cu, x, fused, GELU, T)
    assert ds is not None and [d.label.split()[0] for d in ds][-1].endswith("_gate_up") and len(ds) == 2
    g, u, apart = _nan(gpu, T * N), _nan(gpu, T * N), _nan(gpu, T * N)
    ref = (KM.matmul_dispatches(kernels, wg, cg, x, g, None, T) + KM.matmul_dispatches(kernels, wu, cu, x, u, None, T)
           + [KG4.gated_gelu_f16_dispatch(kernels, g, u, apart, T * N)])
    run(gpu, ds + ref)
    gate = read(gpu, g, np.float32, T * N)
    _table_range(gate)
    want = _words(gpu, apart, T * N)
    assert not np.isnan(want.view(np.float32)).any()
    np.testing.assert_array_equal(_words(gpu, fused, T * N), want)
    # and both are the table GELU of the products (the GEMV's sums, to float error)
    xi = matmul_input(read(gpu, x, np.float32, T * K).reshape(T, K), qg).astype(np.float64)
    np.testing.assert_allclose(gate.reshape(T, N), xi @ np.asarray(reference(wg), np.float64).T, rtol=1e-4,
                               atol=1e-4 * np.abs(gate).max())


@pytest.mark.parametrize("types", [(Q.Q8_0, Q.Q8_0), (Q.Q4_K, Q.Q6_K), (Q.Q5_0, None)],
                         ids=["q8_0", "q4_k+q6_k", "q5_0-fused-gate-up"])
def test_expert_pair_equals_gate_up_then_table_gelu(gpu, kernels, types):
    rng = np.random.default_rng(11)
    qg, qu = types
    fused = qu is None
    E, N, T, k, K = 6, 19, 3, 2, 256
    A = T * k
    if fused:  # one gate_up bank: each expert's N gate rows, then its N up rows
        wg = _bank(qg, E, 2 * N, K, rng)
        cg = cu = KMoE.upload_bank(gpu, wg)
        qu = qg
    else:
        wg = _bank(qg, E, N, K, rng)
        cg, cu = KMoE.upload_bank(gpu, wg), KMoE.upload_bank(gpu, _bank(qu, E, N, K, rng))
    ids = _u32(gpu, _pairs(rng, T, k, E))
    x = _x(rng, T, K, wg)
    d, xq = KQ.quantize_dispatch(kernels, storage(gpu, x), K, T, into=storage(gpu, 4 * T * KQ.words(K)))
    y = _nan(gpu, A * N)
    ds = KMoE.expert_pair(kernels, qg, qu, K, N, cg, cu, xq, y, GELU, A, ids, k, fused)
    assert all(dd.label.startswith(f"gemv_{qg.name.lower()}_expert_gate_up") for dd in ds)
    g, u, apart = _nan(gpu, A * N), _nan(gpu, A * N), _nan(gpu, A * N)
    rb = KM.row_bytes(qg, K)
    if fused:
        ref = [dd for i, dst in enumerate((g, u))
               for dd in KMoE.expert_matmul(kernels, qg, K, N, cg, xq, dst, A, ids, k, 2 * N * rb, i * N * rb)]
    else:
        ref = (KMoE.expert_matmul(kernels, qg, K, N, cg, xq, g, A, ids, k)
               + KMoE.expert_matmul(kernels, qu, K, N, cu, xq, u, A, ids, k))
    run(gpu, [d] + ds + ref + [KS.gated_dispatch(kernels, g, u, apart, A * N, GELU)])
    _table_range(read(gpu, g, np.float32, A * N))
    want = _words(gpu, apart, A * N)
    assert not np.isnan(want.view(np.float32)).any()
    np.testing.assert_array_equal(_words(gpu, y, A * N), want)
    # the unfused words are the table GELU of gate times up, as the CPU reference applies it
    gate, up = (read(gpu, b, np.float32, A * N) for b in (g, u))
    np.testing.assert_array_equal(want.view(np.float32), F.gated_act(gate, up, GELU))


# (type, N, K, T, tile): prompt batches (T >= MMQ_MIN_T), the int8 GEMM's pair with its own tile or
# test_mmq_types's PAIR tile (PREFETCH 1) against gate and up in the plain tiles
MMQ = [(Q.Q4_K, 37, 512, 70, None), (Q.Q6_K, 21, 256, 33, None), (Q.Q8_0, 72, 512, 70, KMQ.MmqTile(64, 64, 4, 4, 0, 1))]


@pytest.mark.parametrize("q,N,K,T,tile", MMQ, ids=["q4_k", "q6_k", "q8_0-prefetch"])
def test_mmq_pair_equals_gate_up_then_table_gelu(gpu, kernels, q, N, K, T, tile):
    rng = np.random.default_rng([int(q), N, T])
    wg, wu = make_weight(q, N, K, rng), make_weight(q, N, K, rng)
    cg, cu = KM.upload_weight(gpu, wg), KM.upload_weight(gpu, wu)
    d, xq = KQ.quantize_dispatch(kernels, storage(gpu, _x(rng, T, K, wg)), K, T,
                                 into=storage(gpu, 4 * T * KQ.words(K)))
    assert tile is not None or KMQ.pairs_act(kernels, wg, cg, T, GELU)  # no tensor cores here: the int8 tiles
    fused = _nan(gpu, T * N)
    ds = KMQ.gate_up_dispatches(kernels, wg, wu, cg, cu, xq, fused, GELU, T, tile=tile)
    assert ds is not None and all(dd.label.startswith(f"mmq_{q.name.lower()}_gate_up") for dd in ds)
    g, u, apart = _nan(gpu, T * N), _nan(gpu, T * N), _nan(gpu, T * N)
    ref = (KMQ.mmq_dispatches(kernels, wg, cg, xq, g, None, T) + KMQ.mmq_dispatches(kernels, wu, cu, xq, u, None, T)
           + [KG4.gated_gelu_f16_dispatch(kernels, g, u, apart, T * N)])
    run(gpu, [d] + ds + ref)
    _table_range(read(gpu, g, np.float32, T * N))
    want = _words(gpu, apart, T * N)
    assert not np.isnan(want.view(np.float32)).any()
    np.testing.assert_array_equal(_words(gpu, fused, T * N), want)


def test_the_tensor_cores_pair_takes_the_table_gelu_when_asked(kernels, tune, monkeypatch):
    """kernels_mma's pair with the table GELU waits for a GPU run (test_mma.py's, Dawn only): where a
    batch's pair tile is a tensor-core tile, pairs_act sends the table GELU to gate, up and
    gated_gelu_f16 unless INFR_MMA_TABLE_PAIR=1; int8 GEMM tiles and other activations always pair."""
    w = SimpleNamespace(qtype=Q.Q4_K, shape=(64, 256))
    chunks = [(None, 0, 64)]
    monkeypatch.setattr(KMQ, "_tile", lambda *a, **k: KMA.MmaTile(64, 64, 4, 2, 2, 0))
    assert not KMQ.pairs_act(kernels, w, chunks, 64, "gelu_f16") and KMQ.pairs_act(kernels, w, chunks, 64, "gelu")
    tune(INFR_MMA_TABLE_PAIR="1")
    assert KMQ.pairs_act(kernels, w, chunks, 64, "gelu_f16")
    tune(INFR_MMA_TABLE_PAIR="0")
    monkeypatch.setattr(KMQ, "_tile", lambda *a, **k: KMQ.TILES[0])
    assert KMQ.pairs_act(kernels, w, chunks, 64, "gelu_f16")


def test_an_unknown_pair_activation_is_refused():
    with pytest.raises(UnsupportedError, match="relu"):
        KM.pair_act_consts("relu")


# --- end to end: the pairs inside gemma4 decode steps


def _labels(g: GPUBackend, T: int) -> list[str]:
    return [d.label for d in g._graph(T, T)[0].dispatches]


@pytest.mark.parametrize("preset,changes", [("tiny-gemma4", {}), ("tiny-gemma4-e2b", {}),
                                            ("tiny-gemma4-moe", {"n_ff_exp": 64}), ("tiny-gemma4", {"n_embd": 256})],
                         ids=["dense", "e2b-double-wide", "moe-experts-of-64", "dense-256"])
def test_tiny_gemma4_decodes_through_the_fused_pairs(gpu, tmp_path, preset, changes):
    """Q8_0 weights of 64-value rows (the tiny models' width): every dense FFN, the E2B's double-wide
    ones, and (experts widened to 64, the int8 expert GEMV's unit) the routed experts take the pair,
    no gated_gelu_f16 left but the E2B's per-layer-input gate; in a prompt the dense FFNs take the
    int8 GEMM's pair (rows of whole 64s, and widened to 256). Greedy tokens the CPU reference's after
    a prompt of MMQ_MIN_T tokens."""
    spec = replace(synth.PRESETS[preset], weight_type="Q8_0", **changes)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / f"{preset}.gguf"))
    plan = build_plan(build_spec(gf))
    g, c = GPUBackend(gf, plan, 64), CPUBackend(gf, plan, 64)
    labels = _labels(g, 1)
    n_layers = plan.spec.n_layers
    assert sum(lb.startswith("gemv_q8_0_gate_up") for lb in labels) == n_layers
    ple = preset == "tiny-gemma4-e2b"  # its per-layer-input gate: the table GELU over a strided slice
    assert labels.count("gated_gelu_f16") == (n_layers if ple else 0)
    experts = "n_ff_exp" in changes
    assert sum(lb.startswith("gemv_q8_0_expert_gate_up") for lb in labels) == (n_layers if experts else 0)
    T = KMQ.MMQ_MIN_T
    prompt_labels = _labels(g, T)
    # grouped experts take the pair too (test_tiny_gemma4_moe_prompt_takes_the_grouped_experts)
    assert prompt_labels.count("gated_gelu_f16") == (n_layers if ple else 0)
    assert sum(lb.startswith("mmq_q8_0_gate_up") for lb in prompt_labels) == n_layers
    prompt = np.random.default_rng(5).integers(0, plan.spec.n_vocab, T).tolist()
    first = int(np.argmax(g.forward(prompt, 0)[-1]))
    got = [first] + g.decode_greedy(first, len(prompt), 12)  # one-token steps past the 8-token window
    assert_follows_greedy(c, prompt, got)
    assert len(set(got)) > 2


@pytest.mark.parametrize("n_ff_exp", [256, 192], ids=["experts-of-256", "experts-of-192"])
def test_tiny_gemma4_moe_prompt_takes_the_grouped_experts(gpu, tmp_path, n_ff_exp, monkeypatch):
    """Experts of 256-value rows, and of 192 (down rows not whole 256s, as the 26B's 704): a prompt
    batch runs them as grouped int8 GEMMs (the gate||up pair with the table GELU, then down; each
    expert's output scale in the combine), not one GEMV row a pair; greedy tokens the CPU reference's.
    With the device's storage bindings below the pair's (TABLE_PAIR_BUFFERS), gate and up apart and
    gated_gelu_f16: the same tokens."""
    spec = replace(synth.PRESETS["tiny-gemma4-moe"], weight_type="Q8_0", n_embd=256, n_ff_exp=n_ff_exp)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / f"moe{n_ff_exp}.gguf"))
    plan = build_plan(build_spec(gf))
    g, c = GPUBackend(gf, plan, 64), CPUBackend(gf, plan, 64)
    T, n_layers = KMQ.MMQ_MIN_T, plan.spec.n_layers
    labels = _labels(g, T)
    assert sum(lb.startswith("mmq_q8_0_expert_gate_up ") for lb in labels) == n_layers
    assert sum(lb.startswith("mmq_q8_0_expert ") for lb in labels) == n_layers  # down
    assert "gated_gelu_f16" not in labels
    assert sum(lb.startswith("moe_group") for lb in labels) >= n_layers
    assert not any(lb.startswith("gemv_q8_0_expert") for lb in labels)
    prompt = np.random.default_rng(6).integers(0, plan.spec.n_vocab, T).tolist()
    first = int(np.argmax(g.forward(prompt, 0)[-1]))
    got = [first] + g.decode_greedy(first, len(prompt), 8)
    assert_follows_greedy(c, prompt, got)
    assert len(set(got)) > 2
    short = dict(g.dev.limits, **{"max-storage-buffers-per-shader-stage": KMoE.TABLE_PAIR_BUFFERS - 1})
    monkeypatch.setattr(g.dev, "limits", short)
    g2 = GPUBackend(gf, plan, 64)
    labels = _labels(g2, T)
    assert sum(lb.startswith("mmq_q8_0_expert ") for lb in labels) == 3 * n_layers  # gate, up, down
    assert labels.count("gated_gelu_f16") == n_layers
    first2 = int(np.argmax(g2.forward(prompt, 0)[-1]))
    assert [first2] + g2.decode_greedy(first2, len(prompt), 8) == got
