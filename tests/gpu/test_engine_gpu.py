"""The engine on the GPU backend (lavapipe in CI): requests batched in shared steps give the
tokens each gives alone, and the CPU reference's; the multi-step greedy loop agrees with single steps."""

from __future__ import annotations

import pytest

from infr import synth
from infr.engine import Model
from infr.sampling import SamplingParams
from infr.scheduler import Request
from tests.gpu.conftest import gpu  # noqa: F401  the GPU fixture: skips without an adapter, fails under CI

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [list(range(1, 10)), list(range(5, 45)), [1, 2, 3], list(range(100, 170)), list(range(5, 40)) + [7, 8]]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    spec = synth.preset("tiny-llama", tokenizer="gpt2", weight_type="Q4_K_M")
    return synth.write_gguf(spec, tmp_path_factory.mktemp("engine") / "tiny-q4km.gguf")


def _run(model, prompts, **kw):
    reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=7, ignore_eos=True, **kw)) for p in prompts]
    model.engine.run_until(lambda: all(r.done for r in reqs))
    assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
    return [r.output for r in reqs]


def test_batched_equals_alone_and_the_cpu_reference(gpu, tiny_path):  # noqa: F811
    on_gpu = Model(tiny_path, n_ctx=128, backend="gpu", parallel=len(PROMPTS))
    on_cpu = Model(tiny_path, n_ctx=128, backend="cpu", parallel=len(PROMPTS))
    together = _run(on_gpu, PROMPTS)
    assert on_gpu.engine.stats.max_rows >= len(PROMPTS)  # the requests shared steps
    alone = [_run(on_gpu, [p], cache_prompt=False)[0] for p in PROMPTS]
    assert together == alone == _run(on_cpu, PROMPTS)
    assert on_gpu.pool.used == 0


def test_batch_budget_past_the_gpu_step_is_cut_to_it(gpu, tiny_path):  # noqa: F811
    """--batch-tokens 2048 on the GPU backend, whose step buffers hold MAX_BATCH rows: the engine cuts
    its budget to those rows and says so, and prompts of more rows than one step holds all finish with
    the tokens each gives alone (every request of such a step failed before)."""
    from infr.gpu.backend import MAX_BATCH

    prompts = [list(range(1 + i, 201 + i)) for i in range(3)]  # 600 prompt rows
    model = Model(tiny_path, n_ctx=256, backend="gpu", parallel=3, batch_tokens=4 * MAX_BATCH)
    assert model.batch_tokens == model.backend.max_rows == MAX_BATCH
    assert f"{4 * MAX_BATCH} tokens per step asked" in model.batch_note and str(MAX_BATCH) in model.batch_note
    together = _run(model, prompts)
    assert model.engine.stats.max_rows == MAX_BATCH  # a full step
    assert together == [_run(model, [p], cache_prompt=False)[0] for p in prompts]


def test_prompt_submitted_in_parts_gives_the_same_logits(gpu, tiny_path, tune, monkeypatch):  # noqa: F811
    """INFR_SUBMIT_PARTS=3: a prompt step's body goes to the queue in three command buffers as it is
    encoded (two more submits than one buffer), with the logits of one buffer; a step below
    INFR_SUBMIT_MIN_T rows stays whole."""
    import numpy as np

    model = Model(tiny_path, n_ctx=128, backend="gpu")
    be, prompt = model.backend, list(range(3, 43))
    q = be.dev.device.queue
    submits, real = [], q.submit
    monkeypatch.setattr(q, "submit", lambda cmds: submits.append(len(cmds)) or real(cmds))

    def run(tokens, **env):
        tune(**env)
        submits.clear()
        logits = be.forward(tokens, 0, n_logits=2)
        return logits, len(submits)

    one, n_one = run(prompt, INFR_SUBMIT_PARTS="1")
    parts, n_parts = run(prompt, INFR_SUBMIT_PARTS="3", INFR_SUBMIT_MIN_T="16")
    assert n_parts == n_one + 2
    np.testing.assert_array_equal(parts, one)
    short, n_short = run(prompt[:8], INFR_SUBMIT_PARTS="1")
    whole, n_whole = run(prompt[:8], INFR_SUBMIT_PARTS="3", INFR_SUBMIT_MIN_T="16")
    assert n_whole == n_short
    np.testing.assert_array_equal(whole, short)
    with pytest.raises(ValueError, match="INFR_SUBMIT_PARTS"):
        tune(INFR_SUBMIT_PARTS="0")


def test_multi_step_equals_single_steps(gpu, tiny_path, monkeypatch):  # noqa: F811
    model = Model(tiny_path, n_ctx=128, backend="gpu", parallel=3)
    calls, real = [], model.backend.decode_steps
    monkeypatch.setattr(model.backend, "decode_steps", lambda batch, k, **kw: calls.append(k) or real(batch, k, **kw))
    multi = _run(model, PROMPTS[:3], cache_prompt=False)
    assert calls and max(calls) > 1  # greedy decode ran several steps per call
    calls.clear()
    monkeypatch.setattr(model.backend, "multi_step", 1)  # every token its own step(batch)
    assert _run(model, PROMPTS[:3], cache_prompt=False) == multi and not calls


def test_warming_builds_what_the_decode_steps_take(gpu, tiny_path, tune, monkeypatch):  # noqa: F811
    """The idle engine's warm_next builds the greedy decode step of each bucket of rows up to
    --parallel, near and far keys (one-pass up to 256 keys in a 2048-key context), one shape a call;
    streams of 1 to 3 rows afterwards, near and far, run their decode steps (decode_steps) without
    recording one, and give the tokens of a model never warmed."""
    tune(INFR_ATTN_SPLIT_FROM="256", INFR_ATTN_ONE_PASS_CTX="1024")
    model = Model(tiny_path, n_ctx=2048, backend="gpu", parallel=3)
    be = model.backend
    assert be._has_spans(1, True)
    calls = 1
    while model.engine.warm_next():
        calls += 1
    assert calls == 6 and not model.engine.warm_next()  # 1, 2 and 3 rows (bucket 4), near and far
    built = set(be.__dict__.get("_multi", {}))
    assert built == {(T, far, None) for T in (1, 2, 4) for far in (False, True)}
    steps, real = [], be.decode_steps
    monkeypatch.setattr(be, "decode_steps", lambda batch, k, **kw: steps.append(batch.rows) or real(batch, k, **kw))
    prompts = [list(range(1, 300)), [5, 6, 7], list(range(9, 20))]  # the first sees far keys
    outputs = [_run(model, prompts[:rows], cache_prompt=False) for rows in (1, 2, 3)]
    assert set(steps) == {1, 2, 3}  # every stream's decode ran there
    assert set(be.__dict__["_multi"]) == built
    cold = Model(tiny_path, n_ctx=2048, backend="gpu", parallel=3)
    assert outputs == [_run(cold, prompts[:rows], cache_prompt=False) for rows in (1, 2, 3)]


@pytest.fixture(scope="module")
def tiny_qwen35_path(tmp_path_factory):
    spec = synth.preset("tiny-qwen35", tokenizer="gpt2", weight_type="F32")
    return synth.write_gguf(spec, tmp_path_factory.mktemp("engine") / "tiny-qwen35.gguf")


@pytest.mark.parametrize("path", ["tiny_path", "tiny_qwen35_path"])
def test_arrival_during_multi_step_decode(gpu, path, request):  # noqa: F811
    """A request that arrives while the engine is in a long multi-step call is taken at the next
    few steps (the call starts no more steps and hands out those in flight), and every output
    equals its request run alone: also on a recurrent model (qwen35), whose state took every
    step that ran."""
    model = Model(request.getfixturevalue(path), n_ctx=128, backend="gpu", parallel=3)
    assert model.backend.multi_step > 1
    n = 40

    def alone(p):
        r = model.engine.submit(Request(list(p), GREEDY, max_new=n, ignore_eos=True, cache_prompt=False))
        model.engine.run_until(lambda: r.done)
        return r.output

    want = [alone(p) for p in PROMPTS[:2]]
    late: list = []
    seen = []

    def on_token(token, _logits):
        seen.append(token)
        if len(seen) == 12 and not late:  # in the middle of the first request's decode
            late.append(model.engine.submit(Request(list(PROMPTS[1]), GREEDY, max_new=n, ignore_eos=True,
                                                    cache_prompt=False)))
        return False

    first = model.engine.submit(Request(list(PROMPTS[0]), GREEDY, max_new=n, ignore_eos=True,
                                        cache_prompt=False, on_token=on_token))
    model.engine.run_until(lambda: first.done and bool(late) and late[0].done)
    assert [first.output, late[0].output] == want
    assert late[0].t_first < first.t_done  # it did not wait for the first to end


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_real_model_batched_equals_alone(gpu, name, request):  # noqa: F811
    """The engine seam's bar on lavapipe: the CPU reference's eight prompts of different lengths
    (two sharing a 400-token prefix), each run alone and then all at once in shared steps, give
    the same greedy tokens."""
    from tests.test_engine import MODELS, N_NEW, _prompts

    path = request.getfixturevalue(MODELS[name])
    prompts = _prompts(name)
    ctx = max(len(p) for p in prompts) + N_NEW + 8
    model = Model(path, n_ctx=ctx, backend="gpu", parallel=8, kv_tokens=8 * ctx)

    def run(ps, **kw):
        reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=N_NEW, **kw)) for p in ps]
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.finish_reason in ("length", "stop") for r in reqs), [r.error for r in reqs]
        return [r.output for r in reqs]

    alone = [run([p], cache_prompt=False)[0] for p in prompts]
    steps = model.engine.stats.steps
    together = run(prompts)
    assert together == alone
    assert model.engine.stats.max_rows >= 8 and model.engine.stats.steps - steps < 8 * N_NEW
    assert model.pool.used == 0


# ---------------------------------------------------------------- sliding-window layers (infr/kvseq.py)


@pytest.fixture(scope="module")
def tiny_gemma3_path(tmp_path_factory):
    spec = synth.preset("tiny-gemma3", tokenizer="gpt2")  # a window of 8, one global layer in seven
    return synth.write_gguf(spec, tmp_path_factory.mktemp("engine") / "tiny-gemma3.gguf")


def test_window_layers_batched_equals_alone_and_the_cpu_reference(gpu, tiny_gemma3_path):  # noqa: F811
    """tiny-gemma3 on the GPU: the window layers read their own store through their own table,
    whose released blocks read as block 0; prompts far past the window, batched, alone and on the
    CPU reference give the same tokens, while each sequence holds a window block or two."""
    prompts = PROMPTS + [list(range(200, 400))]
    on_gpu = Model(tiny_gemma3_path, n_ctx=512, backend="gpu", parallel=len(prompts), batch_tokens=64)
    assert on_gpu.window_pool.n_blocks < on_gpu.pool.n_blocks and on_gpu.backend.n_window_blocks < on_gpu.backend.n_blocks
    held = []
    long = on_gpu.engine.submit(Request(list(prompts[-1]), GREEDY, max_new=7, ignore_eos=True,
                                        on_token=lambda t, _: held.append(long.kv.window_held) and False))
    together = _run(on_gpu, prompts[:-1])
    on_gpu.engine.run_until(lambda: long.done)
    together.append(long.output)
    assert on_gpu.engine.stats.max_rows >= len(prompts) - 1
    assert held and max(held) <= 3 < -(-len(prompts[-1]) // 32)  # 200 positions: 7 blocks in the full layers
    alone = [_run(on_gpu, [p], cache_prompt=False)[0] for p in prompts]
    on_cpu = Model(tiny_gemma3_path, n_ctx=512, backend="cpu", parallel=len(prompts), batch_tokens=64)
    assert together == alone == _run(on_cpu, prompts)
    assert on_gpu.pool.used == 0 and on_gpu.window_pool.used == 0


def test_gemma3_past_its_window_equals_the_cpu_reference(gpu, gemma3_path):  # noqa: F811
    """Gemma-3's 670-token fixture prompt (window 512) through the engine on the GPU: the window
    layers give their blocks back, and the greedy tokens are the CPU reference's (one sequence: a
    minute on lavapipe; batched equals alone on window layers is tiny-gemma3's test above)."""
    import json

    from tests.test_engine import FIXTURES

    cases = json.loads((FIXTURES / "generation_gemma3-270m.json").read_text())["cases"]
    prompts = [max((c["prompt_ids"] for c in cases), key=len)]
    assert len(prompts[0]) > 512
    ctx = len(prompts[0]) + 16

    def run(model):
        held = []
        reqs = [model.engine.submit(Request(list(p), GREEDY, max_new=6, ignore_eos=True)) for p in prompts]
        reqs[0].on_token = lambda t, _: held.append((len(reqs[0].kv.full), reqs[0].kv.window_held)) and False
        model.engine.run_until(lambda: all(r.done for r in reqs))
        assert all(r.finish_reason == "length" for r in reqs), [r.error for r in reqs]
        assert model.pool.used == 0 and model.window_pool.used == 0
        return [r.output for r in reqs], held

    got, held = run(Model(gemma3_path, n_ctx=ctx, backend="gpu"))
    assert held and all(win < full for full, win in held[1:])  # blocks older than the window went back
    assert got == run(Model(gemma3_path, n_ctx=ctx, backend="cpu"))[0]
