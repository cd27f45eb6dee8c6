"""The GEMV's gate||up pair writing its output rounded too (wgsl/gemv_q8_on.wgsl,
kernels_matmul.pair_rounds): word for word what the unfused pair and quantize_q8 write, for
every GEMV type, pairs of two types, each activation, both rounding modes, batches of 1..9
tokens (one and several tokens a workgroup), chunked weights; the lowering drops down's
quantize_q8 dispatch, and a decode step's logits are bit for bit those of the unfused graph."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_q8 as KQ
from infr.gpu import tuning
from infr.gpu.runtime import read, run, storage
from infr.numerics import INFR, LLAMACPP

from test_quant_kernels import make_weight  # tests/gpu is on sys.path (pytest's prepend import mode)
from test_tint import _tint_errors, tint  # noqa: F401  tint: Dawn's Null device (skips without wgpudawn)


@pytest.fixture(autouse=True)
def pair_rounds_on():
    """GemvTuning.Q8 on (the default; INFR_GEMV_Q8=0 turns it off); tests of the old path set 0."""
    with tuning.override(gemv=replace(tuning.current().gemv, Q8=1)):
        yield

TYPES = sorted(KM.GEMV_FAMILY, key=int)


def _k(q: Q) -> int:
    return 320 if KM.block_shape(q)[0] == 32 else 512  # a partial 256-value chunk for the 32-value types


def _both(gpu, kernels, wg, wu, x, T: int, act: str, max_binding=None):
    """(y, rounded y) from the pair then quantize_q8, and from the pair alone with yq."""
    N = int(wg.shape[0])
    cg, cu = (KM.upload_weight(gpu, w, max_binding=max_binding) for w in (wg, wu))
    xb = storage(gpu, x)
    out = []
    for fused in (False, True):
        y = storage(gpu, np.full((T, N), np.nan, np.float32))
        yq = storage(gpu, np.full(T * KQ.words(N), 0xDEADBEEF, np.uint32))
        if fused:
            assert KM.pair_rounds(gpu, N, cg, T)
            ds = KM.gate_up_dispatches(kernels, wg, wu, cg, cu, xb, y, act, T, yq=yq)
            assert all("_gate_up_q8 " in d.label for d in ds[1:]) and len(ds) == 1 + len(cg)
        else:
            ds = KM.gate_up_dispatches(kernels, wg, wu, cg, cu, xb, y, act, T)
            ds.append(KQ.quantize_dispatch(kernels, y, N, T, into=yq)[0])
        run(gpu, ds)
        out.append((read(gpu, y, count=T * N), read(gpu, yq, np.uint32, count=T * KQ.words(N))))
    return out


def _assert_same(out) -> None:
    (y0, q0), (y1, q1) = out
    assert not np.isnan(y0).any()
    np.testing.assert_array_equal(y1.view(np.uint32), y0.view(np.uint32))
    assert (q0 != 0xDEADBEEF).all()
    np.testing.assert_array_equal(q1, q0)


@pytest.mark.parametrize("qtype", TYPES, ids=[t.name.lower() for t in TYPES])
def test_pair_rounds_as_quantize(gpu, kernels, qtype):
    rng = np.random.default_rng(int(qtype))
    N, K, T = 192, _k(qtype), 3  # 192: a last 256-value group of the layout only 3/4 full
    wg, wu = make_weight(qtype, N, K, rng), make_weight(qtype, N, K, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    _assert_same(_both(gpu, kernels, wg, wu, x, T, "silu"))


@pytest.mark.parametrize("mode", [INFR, LLAMACPP])
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_f16"])
@pytest.mark.parametrize("T", [1, 2, 9])  # one token a workgroup, two, and eight with a ragged last group
def test_pair_rounds_each_act_mode_and_batch(gpu, kernels, mode, act, T):
    rng = np.random.default_rng(T)
    N, K = 256, 256
    wg, wu = make_weight(Q.Q4_K, N, K, rng), make_weight(Q.Q6_K, N, K, rng)  # two types: two readers
    x = rng.standard_normal((T, K)).astype(np.float32)
    x[0, :64] *= 50.0  # rows of different scale
    _assert_same(_both(gpu, kernels.rounding(mode), wg, wu, x, T, act))


def test_pair_rounds_over_chunks(gpu, kernels):
    """Chunks of whole 32-row blocks each round their own rows into the one row of the matrix's width."""
    rng = np.random.default_rng(3)
    N, K, T = 448, 256, 2
    wg, wu = make_weight(Q.Q4_K, N, K, rng), make_weight(Q.Q4_K, N, K, rng)
    rb = KM.row_bytes(Q.Q4_K, K)
    limit = 64 * rb + KM.WEIGHT_TAIL  # 64 rows a chunk: 7 chunks
    assert len(KM.upload_weight(gpu, wg, max_binding=limit)) == 7
    x = rng.standard_normal((T, K)).astype(np.float32)
    _assert_same(_both(gpu, kernels, wg, wu, x, T, "silu", max_binding=limit))


def test_pair_rounds_only_whole_blocks(gpu):
    rng = np.random.default_rng(0)
    w = make_weight(Q.Q4_K, 448, 256, rng)
    assert KM.pair_rounds(gpu, 448, KM.upload_weight(gpu, w), 1)
    assert not KM.pair_rounds(gpu, 480, [(None, 0, 480)], 1)  # not whole 64-value groups of the layout
    rb = KM.row_bytes(Q.Q4_K, 256)
    chunks = KM.upload_weight(gpu, w, max_binding=40 * rb + KM.WEIGHT_TAIL)  # chunks of 40 rows
    assert not KM.pair_rounds(gpu, 448, chunks, 1)
    with tuning.override(gemv=replace(tuning.current().gemv, Q8=0)):
        assert not KM.pair_rounds(gpu, 448, KM.upload_weight(gpu, w), 1)


MODELS = {  # preset, weight type, overrides: 256 wide, so the norms round and every matrix takes the int8 GEMV
    "llama-q4_k_m": ("tiny-llama", "Q4_K_M", dict(n_ff=768)),  # Q4_K pairs, Q4_K and Q6_K down
    "llama-q8_0": ("tiny-llama", "Q8_0", dict(n_ff=768)),
    "qwen3moe": ("tiny-qwen3moe", "Q8_0", dict(n_ff=256)),  # the experts' pair (64 rows) over expert banks
}


def tiny_256(tmp_path, name: str, preset: str, weight_type: str, **extra):
    """(file, plan) of a 3-layer `preset` 256 wide (4 heads of 64, 2 KV heads): the norms round and every
    matrix takes the int8 GEMV (also tests/gpu/test_qkv_rope.py's)."""
    from infr import synth
    from infr.gguf_file import open_gguf
    from infr.models import build_spec
    from infr.plan import build_plan
    from infr.synth_presets import PRESETS

    spec = replace(PRESETS[preset], n_layers=3, n_embd=256, n_heads=4, n_kv_heads=2, head_dim=64,
                   weight_type=weight_type, name=name, **extra)
    gf = open_gguf(synth.write_gguf(spec, tmp_path / f"{name}.gguf"))
    return gf, build_plan(build_spec(gf))


def _model(tmp_path, name: str):
    preset, weight_type, extra = MODELS[name]
    return tiny_256(tmp_path, name, preset, weight_type, **extra)


@pytest.mark.parametrize("name", list(MODELS))
def test_decode_drops_down_quantize_with_the_same_logits(tmp_path, gpu, name):
    """A layer's decode step loses its quantize_q8 (down's input comes rounded from the pair), and
    its logits, a batch of rows' too, are bit for bit those of the unfused graph."""
    from infr.gpu.backend import GPUBackend

    gf, plan = _model(tmp_path, name)
    prompt = [1, 17, 42, 99, 3, 250]
    got = {}
    for q8 in (0, 1):
        with tuning.override(gemv=replace(tuning.current().gemv, Q8=q8)):
            be = GPUBackend(gf, plan, 64, dev=gpu)
            labels = [d.label for d in be._multi_step(1, False).dispatches]
            fused = sum("_gate_up_q8 " in lb for lb in labels)
            assert fused == q8 * plan.spec.n_layers, labels
            assert sum(lb.startswith("quantize_q8") for lb in labels) == (1 - q8) * plan.spec.n_layers, labels
            rows = be.forward(prompt[:4], 0)  # 4 rows: the GEMV with several tokens a workgroup
            step = be.forward([prompt[4]], 4)
            got[q8] = (rows, step)
    for a, b in zip(got[0], got[1]):
        np.testing.assert_array_equal(np.asarray(b).view(np.uint32), np.asarray(a).view(np.uint32))



def test_rounding_pairs_pass_tint(gpu, tint):  # noqa: F811
    """The rounding pair in every form the engine may ask for (both rounding modes, each activation,
    1..8 tokens a workgroup, expert banks) compiles under Tint (tests/gpu/test_tint.py)."""
    from infr.gpu import runtime as R

    asked: set = set()

    class Recorder(R.Kernels):
        def pipeline(self, name, entry="main", unchecked=False, **consts):
            if self.q8_rounding != INFR:  # what a Kernels.rounding view adds
                consts.setdefault("Q8_ROUND", self.q8_rounding)
            asked.add((name, entry, tuple(sorted(consts.items()))))

    rec = Recorder(gpu)
    for mode in (INFR, LLAMACPP):
        for act in ("silu", "gelu", "gelu_f16"):
            for T in (1, 2, 4, 8):
                KM.gemv_pipeline(rec.rounding(mode), ("q4_k", "q6_k"), pair_act=act, T=T, q8_out=True)
            KM.gemv_pipeline(rec.rounding(mode), ("iq4_xs", "q8_0"), pair_act=act, expert=True, q8_out=True)
    assert len(asked) == 2 * 3 * 5
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_bench_script_times_the_three_sequences(gpu, tmp_path):
    """perf/gate_up_q8_bench.py (what the H100 call runs) at a small size: each row times the pair, the
    pair and its quantize, and the rounding pair."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, "perf/gate_up_q8_bench.py", "--scale", "16", "--T", "1,2", "--types",
                           "q4_k", "--shapes", "8B", "--reps", "2", "--out", str(out)], cwd=root, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("Q4_K")]
    assert len(rows) == 2 and all("pair+quant" in r and "fused" in r for r in rows), proc.stdout
    assert out.exists()
