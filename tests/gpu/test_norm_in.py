"""The GEMV that norms its own input (wgsl/gemv_norm_on.wgsl, kernels_norm_in; GemvTuning.NORM): a
decode step of one row loses the rmsnorm_q8 dispatches whose outputs only int8 GEMVs read, where
the GEMV takes them (the stacked q|k|v with and without its rope epilogue, a gate||up pair that does
not round its output; the kernel also takes the rounding pair, which the lowering does not offer it;
a plain product), and the
logits are bit for bit those of the unfused graph: the prologue sums, multiplies and rounds as
rmsnorm_q8 does. Where the output is read as floats (a MoE's router), where more than one row runs,
or where the GEMV has too many rows (a real output head), the norm stays a dispatch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from infr.gpu import kernels_matmul as KM
from infr.gpu import kernels_norm_in as KN
from infr.gpu import kernels_q8 as KQ
from infr.gpu import tuning
from infr.gpu.runtime import read, run, storage

from test_gate_up_q8 import tiny_256
from test_quant_kernels import make_weight  # tests/gpu is on sys.path (pytest's prepend import mode)
from test_tint import _key, _Recorder, _tint_errors, tint  # noqa: F401  tint: Tint on Dawn's Null device (test_tint's fixture)


def _tune(**kw):
    return tuning.override(gemv=replace(tuning.current().gemv, **kw))


MODELS = {  # preset, weight type, overrides, norms a layer the GEMVs take: 256 wide, so the norms round and
    # every matrix takes the int8 GEMV
    "llama-q4_k_m": ("tiny-llama", "Q4_K_M", {}, 1),  # a mixed stack (Q6_K v) in some layers; pairs that round
    "llama-q8_0-rope-off": ("tiny-llama", "Q8_0", {}, 1),  # the stack without its rope epilogue
    "qwen2": ("tiny-qwen2", "Q8_0", {}, 2),  # biases, NEOX: the stack and rope_kv; 160 rows: a pair that does not round
    "qwen3moe": ("tiny-qwen3moe", "Q8_0", dict(n_ff=256), 1),  # the router reads the FFN norm as floats
}


@pytest.mark.parametrize("name", list(MODELS))
def test_decode_step_norms_in_the_gemv_with_the_same_logits(tmp_path, gpu, name):
    from infr.gpu.backend import GPUBackend

    preset, weight_type, extra, per_layer = MODELS[name]
    gf, plan = tiny_256(tmp_path, name, preset, weight_type, **extra)
    n = plan.spec.n_layers
    rope = 0 if name.endswith("rope-off") else 1
    # the next layers' attention norms in the MoE's combine before them: only with INFR_MOE_COMBINE_NORM=1
    moe = n - 1 if name == "qwen3moe" and tuning.current().moe_combine_norm else 0
    got = {}
    for on in (0, 1):
        with _tune(NORM=on, ROPE=rope):
            be = GPUBackend(gf, plan, 64, dev=gpu)
            labels = [d.label for d in be._multi_step(1, False).dispatches]
            normed = [lb for lb in labels if "_norm " in lb]
            # the attention norm in every layer, the FFN norm too where no router reads it and the pair
            # does not round, and the output norm (this head's 64 workgroups read 128 KiB of row and weight)
            assert len(normed) == on * (n * per_layer + 1 - moe), labels
            assert not any("gate_up_q8_norm" in lb for lb in labels), labels
            assert sum(lb.startswith("rmsnorm_q8") for lb in labels) == 2 * n + 1 - len(normed) - moe, labels
            assert sum(lb.startswith("moe_combine_q8") for lb in labels) == moe, labels
            rows = be.forward([1, 17, 42, 99], 0)  # 4 rows: the norms stay dispatches
            steps = [be.forward([t], 4 + i) for i, t in enumerate((3, 250, 7))]
            got[on] = [rows, *steps]
    for a, b in zip(got[0], got[1]):
        np.testing.assert_array_equal(np.asarray(b).view(np.uint32), np.asarray(a).view(np.uint32))


def _norm_rows(gpu, K: int, rng):
    x = (rng.standard_normal((1, K)) * 3).astype(np.float32)
    g = (1 + 0.5 * rng.standard_normal(K)).astype(np.float32)
    return x, g, storage(gpu, x), storage(gpu, g)


@pytest.mark.parametrize("qtype,K,N,act", [
    (Q.Q4_K, 512, 128, "silu"), (Q.Q5_K, 256, 72, "silu"), (Q.Q6_K, 768, 40, "gelu_f16"), (Q.Q8_0, 256, 33, "silu"),
    (Q.IQ4_XS, 1024, 8, "gelu"),
    # two or more words an invocation, the last partial at 1536 and 2560
    (Q.Q4_K, 1536, 64, "silu"), (Q.Q8_0, 2560, 40, "gelu_f16"), (Q.Q4_K, 8192, 8, "silu")])
def test_plain_and_pair_gemv_equal_norm_then_gemv(gpu, kernels, qtype, K, N, act):
    """matmul_dispatches and gate_up_dispatches (rounding their output too, where whole blocks allow; the
    table GELU's pair binds its table beside the norm's gain) with a NormIn write the bits of rmsnorm_q8
    then the same GEMV, on row counts of partial workgroups."""
    rng = np.random.default_rng(K + N)
    x, g, xb, gb = _norm_rows(gpu, K, rng)
    w, w2 = make_weight(qtype, N, K, rng), make_weight(qtype, N, K, rng)
    chunks, chunks2 = KM.upload_weight(gpu, w), KM.upload_weight(gpu, w2)
    eps = 1e-5
    norm = KN.NormIn(xb, gb, K, eps)
    with _tune(NORM=1):
        assert KN.takes(gpu, K, N, 1, *KM.gemv_needs(gpu))
        normed = storage(gpu, 4 * K)
        d, xq = KQ.rmsnorm_q8_dispatch(kernels, xb, gb, normed, K, eps, 1)
        outs = {}
        for fused in (False, True):
            y, yp = storage(gpu, 4 * N), storage(gpu, 4 * N)
            rounds = N % 64 == 0 and KM.pair_rounds(gpu, N, chunks, 1)
            yq = storage(gpu, 4 * KQ.words(N)) if rounds else None
            src = norm if fused else xq
            ds = KM.matmul_dispatches(kernels, w, chunks, None, y, None, 1, xq=src)
            ds += KM.gate_up_dispatches(kernels, w, w2, chunks, chunks2, None, yp, act, 1, xq=src, yq=yq)
            assert all(("_norm " in dd.label) == fused for dd in ds), [dd.label for dd in ds]
            run(gpu, ([] if fused else [d]) + ds)
            outs[fused] = [read(gpu, b, count=n) for b, n in ((y, N), (yp, N))]
            if yq is not None:
                outs[fused].append(read(gpu, yq, dtype=np.uint32, count=KQ.words(N)))
    for a, b in zip(outs[False], outs[True]):
        np.testing.assert_array_equal(np.asarray(b).view(np.uint32), np.asarray(a).view(np.uint32))


def test_takes():
    """One row, K of whole 256-value units, prologues that read at most MAX_PROLOGUE_BYTES together
    (the 1B's q|k|v and gate||up, not the 8B's nor any output head), the rounded row in workgroup
    memory beside the GEMV's own, a binding to spare, subgroups, and the knob on."""
    from types import SimpleNamespace

    dev = SimpleNamespace(limits={"max-storage-buffers-per-shader-stage": 16,
                                  "max-compute-workgroup-storage-size": 32768}, subgroup_size=32)
    with _tune(NORM=1):
        assert KN.takes(dev, 2048, 3072, 1, 4096, 13, 8)  # the 1B's q|k|v: 384 workgroups, 6 MiB
        assert KN.takes(dev, 2048, 8192, 1, 4096, 8, 32)  # its gate||up pair, rounding: 4 MiB
        assert not KN.takes(dev, 4096, 6144, 1, 4096, 13, 8)  # the 8B's q|k|v: 24 MiB
        assert not KN.takes(dev, 4096, 14336, 1, 4096, 8, 32)  # its pair: 14 MiB
        assert not KN.takes(dev, 2048, 128256, 1, 4096, 5, 8)  # the 1B's head: 250 MiB
        assert not KN.takes(dev, 2048, 3072, 2, 4096, 13, 8)  # a batch: each workgroup one row of several
        assert not KN.takes(dev, 2112, 3072, 1, 4096, 13, 8)
        assert not KN.takes(dev, 2048, 3072, 1, 4096, 16, 8)  # no binding left
        assert not KN.takes(dev, 2048, 3072, 1, 32768 - KN.workgroup_bytes(2048) + 4, 13, 8)
        assert KN.takes(dev, 2048, 3072, 1, 32768 - KN.workgroup_bytes(2048), 13, 8)
        assert not KN.takes(SimpleNamespace(limits=dev.limits, subgroup_size=4), 2048, 3072, 1, 4096, 13, 8)
    with _tune(NORM=0):
        assert not KN.takes(dev, 2048, 3072, 1, 4096, 13, 8)


def test_norm_in_kernels_pass_tint(gpu, tint):  # noqa: F811
    """Every GEMV form the norm can run in (plain, the pair with and without its rounded output and the
    table GELU, the q|k|v split), at one to eight words an invocation, in both roundings, compiles
    under Tint, whose uniformity rules the prologue's barriers and shuffles must meet."""
    asked: set = set()
    rec = _Recorder(gpu, asked)
    with _tune(SG=32):
        for K in (256, 1536, 2560, 8192):
            n = KN.NormIn(None, None, K, 1e-5)
            for q in (Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.IQ4_XS):
                KM.gemv_pipeline(rec, q, norm=n)
                KM.gemv_pipeline(rec, (q, q), pair_act="gelu_f16", norm=n)
                KM.gemv_pipeline(rec, (q, q), pair_act="silu", q8_out=True, norm=n)
                KM.gemv_pipeline(rec, (q, q, Q.Q6_K), split=True, norm=n)
    asked |= {_key(name, entry, {**dict(consts), "Q8_ROUND": "llamacpp"}) for name, entry, consts in asked}
    assert len(asked) == 2 * 4 * 4 * 4
    errors = _tint_errors(tint, asked)
    assert not errors, errors


def test_lowering_puts_a_norm_off_only_before_its_own_readers(tmp_path, gpu):
    """Lowering.norm_in on a llama layer's op list, and on edits of it: the attention norm is put off
    where its readers are the matmuls right after it; not where another op comes between two of them,
    a reader writes the norm's input, a later op reads the output as floats, or the op right after the
    readers writes the input (a pair's activation, which the same GEMV writes); nor with no op list to
    walk, nor for more than one row."""
    from infr.gpu.backend import GPUBackend
    from infr.gpu.lowering import Lowering
    from infr.models.spec import Activation
    from infr.ops import Add, GatedAct, RMSNorm

    gf, plan = tiny_256(tmp_path, "walk", "tiny-llama", "Q8_0")
    with _tune(NORM=1):
        be = GPUBackend(gf, plan, 64, dev=gpu)
        ops = list(be.plan.embed + be.plan.layers + be.plan.head)
        i = next(j for j, op in enumerate(ops) if isinstance(op, RMSNorm))
        norm, q = ops[i], ops[i + 1]

        def puts_off(seq, rows=1, walk=True):
            lower = Lowering(be, rows)
            lower.ahead, lower.after = seq[i + 1], ((seq, i) if walk else None)
            return lower.norm_in(norm, "x", "g", "y")

        assert puts_off(ops)
        assert not puts_off(ops, walk=False)
        assert not puts_off(ops, rows=2)
        assert not puts_off(ops[:i + 2] + [Add("z", "q", "q")] + ops[i + 2:])
        assert not puts_off(ops[:i + 1] + [replace(q, dst=norm.src)] + ops[i + 2:])
        assert not puts_off(ops[:i + 4] + [Add("z", norm.dst, "q")] + ops[i + 4:])
        assert not puts_off(ops[:i + 4] + [GatedAct(norm.src, "q", "k", Activation.SILU)] + ops[i + 4:])
