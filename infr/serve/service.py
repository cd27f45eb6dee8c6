"""The served model: loading, turning validated requests into generation jobs, running them
on the engine's thread (continuous batching, infr/scheduler.py), and the OpenAI response shapes."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
import threading
from dataclasses import dataclass
from pathlib import Path

from infr.errors import InfrError
from infr.kvpool import KVBudget  # noqa: F401 (Config.kv_size)
from infr.sampling import SamplingError, SamplingParams
from infr.serve import generation
from infr.serve.errors import APIError
from infr.serve.grammar import Grammars, tool_call_schema
from infr.serve.output import ChatOutput
from infr.serve.schemas import ChatCompletionRequest, CompletionRequest, _Sampling, check_unsupported, stop_list
from infr.serve.metrics import Metrics
from infr.serve.text import GEMMA4_THOUGHT
from infr.serve.tools import FORCED_PREFIX, PRESERVED_TOKENS, TOOL_SYSTEM_NOTE, ToolCallStream, pick_dialect, template_knows_tools

log = logging.getLogger("infr.serve")


@dataclass
class Config:
    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    api_key: str | None = None
    ctx: int = 4096
    parallel: int = 1
    batch_tokens: int = 512  # rows per engine step at most (chunked prefill)
    kv_size: "int | KVBudget | None" = None  # KV pool capacity: tokens or a fraction of free memory (default: ctx each)
    backend: str = "auto"
    model_alias: str | None = None
    strict_model: bool = False  # 404 for a request naming another model (default: any name is served)
    cpu_moe: int = 0  # experts of the first N MoE layers on the CPU (--cpu-moe)
    split: "SplitOptions | None" = None  # one model across GPUs (--split-mode, --tensor-split; infr/split.py)


def served_id(ref: str | None, alias: str | None = None) -> str:
    """The id clients see: --alias, else the GGUF file's stem for a path, else MODEL as given."""
    if alias:
        return alias
    if not ref:
        from infr.offline import DEFAULT_MODEL

        return DEFAULT_MODEL
    path = Path(ref).expanduser()
    # a bare *.gguf name is a file to store.resolve; org/repo/x.gguf may be an HF ref, kept whole
    if path.is_file() or (ref.endswith(".gguf") and "/" not in ref.removeprefix("hf:")):
        return path.stem
    return ref


def model_not_found(name: str, served: list[str] | None = None) -> APIError:
    """The 404 for a model this server does not serve (`infr serve --strict-model`, `infr cluster`)."""
    also = f"; this server serves {', '.join(map(repr, served))}" if served else ""
    return APIError(404, f"the model {name!r} does not exist{also}", param="model", code="model_not_found")


@dataclass
class Prepared:
    job: generation.Job
    output: ChatOutput | None  # chat only
    max_tokens: int


class Service:
    def __init__(self, config: Config):
        self.config = config
        self.model = None
        self.grammars: Grammars | None = None
        self.metrics = Metrics()
        self.load_error: str | None = None
        self.model_id = served_id(config.model, config.model_alias)
        self.names: set[str] = {self.model_id}
        self.created = int(time.time())
        self._lifespans = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ---------------------------------------------------------------- the engine thread

    def start_workers(self) -> None:
        """The engine thread (started once the model is loaded); an app may run several lifespans."""
        self._lifespans += 1

    def stop_workers(self) -> None:
        self._lifespans -= 1
        if self._lifespans == 0 and self._thread is not None:
            self._stop.set()
            self.model.engine.wake()
            self._thread.join(timeout=30)
            self._thread = None

    def _run_engine(self) -> None:
        eng = self.model.engine
        cold = True  # decode steps not yet built ahead: while idle, one bucket of rows at a time
        while not self._stop.is_set():
            if not eng.wait_for_work(timeout=0.01 if cold else 0.5):
                if cold:
                    try:
                        cold = eng.warm_next()
                    except Exception as e:  # built at first use instead
                        cold = False
                        log.warning("building decode steps ahead failed: %s: %s", type(e).__name__, e)
                continue
            try:
                eng.step()
            except Exception as e:  # that step's requests end with an error; the server goes on
                log.error("engine step failed: %s: %s", type(e).__name__, e)

    def load(self) -> None:
        """Blocking: resolve and load the model, start the engine thread."""
        from infr import store
        from infr.engine import Model

        resolve = getattr(store, "resolve_or_pull", store.resolve)
        path = Path(resolve(self.config.model))
        t0 = time.perf_counter()
        cfg = self.config
        model = Model(path, n_ctx=cfg.ctx, backend=cfg.backend, parallel=cfg.parallel, kv_tokens=cfg.kv_size,
                      batch_tokens=cfg.batch_tokens, cpu_moe=cfg.cpu_moe, split=cfg.split)
        self.grammars = Grammars(model.tokenizer, model.spec.n_vocab)
        self.names |= {path.name, path.stem, str(path)}
        if self.config.model:
            self.names.add(self.config.model)
        self.model = model
        note = f" ({model.backend_note})" if model.backend_note else ""
        pool = model.pool
        sized = f"; {model.kv_note}" if model.kv_note else ""
        plan, win = model.plan, model.window_pool
        mib = pool.n_blocks * pool.block_size * plan.kv_bytes_per_token(False if win else None) / 2**20
        if win is not None:  # the sliding-window layers' store: sized for their windows (infr/kvseq.py)
            mib += win.n_blocks * win.block_size * plan.kv_bytes_per_token(True) / 2**20
            sized += f"; sliding-window layers: {win.n_blocks} blocks (window {plan.window})"
        if model.checkpoints is not None:  # a recurrent model: per-slot state and prefix checkpoints
            sized += "; " + model.checkpoints.line()
        if model.window_checkpoints is not None:  # the window layers' last windows pinned for prefix reuse
            sized += "; " + model.window_checkpoints.line()
        per_step = f" ({model.batch_note})" if model.batch_note else ""
        log.info("loaded %s on %s in %.1fs%s; %d parallel sequence(s), KV cache %d tokens (%d blocks of %d, "
                 "%.1f MiB%s), %d tokens per step%s", path.name, model.backend_name, time.perf_counter() - t0, note,
                 cfg.parallel, pool.n_blocks * pool.block_size, pool.n_blocks, pool.block_size, mib, sized,
                 model.batch_tokens, per_step)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run_engine, name="infr-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self.model is not None

    def require_model(self, name: str | None) -> None:
        if self.model is None:
            raise APIError(503, "the model is still loading" if self.load_error is None
                           else f"the model failed to load: {self.load_error}")
        # one model is served: like llama-server, any name reaches it unless --strict-model
        if self.config.strict_model and name is not None and name not in self.names:
            raise model_not_found(name, [self.model_id])

    # ---------------------------------------------------------------- requests -> jobs

    def _params(self, req: _Sampling) -> SamplingParams:
        p = SamplingParams()
        for field, value in (("temperature", req.temperature), ("top_p", req.top_p), ("top_k", req.top_k),
                             ("min_p", req.min_p), ("presence_penalty", req.presence_penalty),
                             ("frequency_penalty", req.frequency_penalty), ("seed", req.seed),
                             ("repeat_penalty", req.repetition_penalty or req.repeat_penalty)):
            if value is not None:
                setattr(p, field, value)
        try:
            return p.validate()
        except SamplingError as e:
            raise APIError(400, str(e)) from None

    def _budget(self, prompt_len: int, max_tokens: int | None, field: str) -> int:
        n_ctx = self.model.n_ctx
        if prompt_len >= n_ctx:
            raise APIError(400, f"the prompt has {prompt_len} tokens but the context holds {n_ctx} "
                                f"(restart with a larger --ctx or send less)", param="messages",
                           code="context_length_exceeded")
        if max_tokens is not None and max_tokens > n_ctx:
            raise APIError(400, f"{field} is too large: {max_tokens}; this model's context holds {n_ctx} tokens",
                           param=field)
        room = n_ctx - prompt_len
        return min(max_tokens, room) if max_tokens is not None else room

    def prepare_chat(self, req: ChatCompletionRequest) -> Prepared:
        check_unsupported(req)
        self.require_model(req.model)
        if not req.messages:
            raise APIError(400, "messages must hold at least one message", param="messages")
        model, tok = self.model, self.model.tokenizer
        messages = []
        for i, m in enumerate(req.messages):
            d = {k: v for k, v in _plain(m).items() if v is not None}
            if isinstance(m.content, list):
                for part in m.content:
                    if part.type != "text" or part.text is None:
                        raise APIError(400, f"messages[{i}].content: only text parts are supported, got "
                                            f"{part.type!r}", param=f"messages[{i}].content")
            if m.content is None and not (m.role == "assistant" and m.tool_calls):
                raise APIError(400, f"messages[{i}].content is required for a {m.role} message",
                               param=f"messages[{i}].content")
            if m.role == "developer":
                d["role"] = "system"
            messages.append(d)
        tools = [_plain(t) for t in req.tools] if req.tools else None
        choice = req.tool_choice
        names = {t["function"]["name"] for t in tools or []}
        forced_name: str | None = None
        if choice is not None and choice != "auto" and choice != "none" and not tools:
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        if not isinstance(choice, str) and choice is not None:
            forced_name = choice.function.name
            if forced_name not in names:
                raise APIError(400, f"tool_choice names {forced_name!r}, which is not among the tools "
                                    f"({', '.join(sorted(names))})", param="tool_choice")
        use_tools = bool(tools) and choice != "none"
        forced = use_tools and (choice == "required" or forced_name is not None)
        source = model.template.source
        dialect = pick_dialect(source)
        if use_tools and not template_knows_tools(source):
            note = TOOL_SYSTEM_NOTE.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
            messages = [{"role": "system", "content": note}] + messages
        try:
            text = model.template.render(messages, add_generation_prompt=True, tools=tools if use_tools else None)
        except InfrError as e:
            raise APIError(400, f"the chat template refused these messages: {e}", param="messages") from None
        prompt = tok.encode(text, add_special=True, parse_special=True)
        forced_ids: list[int] = []
        constraint = None
        if forced:
            prefix = FORCED_PREFIX[dialect]
            forced_ids = tok.encode(prefix, add_special=False, parse_special=True) if prefix else []
            constraint = self.grammars.json_matcher(tool_call_schema(tools, forced_name), where="tools")
        elif req.response_format is not None and req.response_format.type != "text":
            rf = req.response_format
            if rf.type == "json_schema":
                if rf.json_schema is None or rf.json_schema.schema is None:
                    raise APIError(400, "response_format json_schema needs json_schema.schema",
                                   param="response_format")
                constraint = self.grammars.json_matcher(rf.json_schema.schema)
            else:
                constraint = self.grammars.json_matcher({"type": "object"})
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs to be true", param="top_logprobs")
        max_req = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        budget = self._budget(len(prompt) + len(forced_ids), max_req, field)
        kept_texts = PRESERVED_TOKENS.get(dialect, ()) if use_tools else ()
        think_tags = ("<think>", "</think>")
        if "<|channel>" in source:  # Gemma 4: its thought channel's tags are kept, for reasoning_content
            think_tags = GEMMA4_THOUGHT
            kept_texts += ("<|channel>", "<channel|>")
        keep = frozenset(t for t in map(tok.token_id, kept_texts) if t is not None)
        job = generation.Job(
            prompt=prompt, params=self._params(req), max_tokens=budget, stops=stop_list(req.stop),
            logprobs=(req.top_logprobs or 0) if req.logprobs else None, constraint=constraint,
            forced=forced_ids, cache_prompt=req.cache_prompt, ignore_eos=req.ignore_eos, keep_tokens=keep,
        )
        tool_stream = ToolCallStream(dialect, names, forced_prefix=forced) if use_tools else None
        think_open = text.rstrip().endswith("<think>")
        return Prepared(job, ChatOutput(tool_stream, think_open=think_open, think_tags=think_tags), budget)

    def prepare_completion(self, req: CompletionRequest) -> Prepared:
        check_unsupported(req)
        self.require_model(req.model)
        tok = self.model.tokenizer
        p = req.prompt
        if isinstance(p, list) and p and all(isinstance(x, int) for x in p):
            prompt = list(p)
            bad = [x for x in prompt if not 0 <= x < tok.n_vocab]
            if bad:
                raise APIError(400, f"prompt token {bad[0]} is outside the vocabulary (0..{tok.n_vocab - 1})",
                               param="prompt")
        else:
            if isinstance(p, list):
                if len(p) != 1 or not isinstance(p[0], str):
                    raise APIError(400, "prompt must be a string, one string in a list, or a list of token ids "
                                        "(one prompt per request)", param="prompt")
                p = p[0]
            prompt = tok.encode(p, add_special=True, parse_special=True)
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        budget = self._budget(len(prompt), req.max_tokens if req.max_tokens is not None else 16, "max_tokens")
        job = generation.Job(prompt=prompt, params=self._params(req), max_tokens=budget,
                             stops=stop_list(req.stop), logprobs=req.logprobs, cache_prompt=req.cache_prompt,
                             ignore_eos=req.ignore_eos)
        return Prepared(job, None, budget)

    # ---------------------------------------------------------------- running

    async def events(self, job: generation.Job) -> AsyncIterator[tuple[str, object]]:
        """("text", {"text", "logprobs"}) events, then ("done", Outcome). Leaving early (a client
        that disconnected) cancels the request; the engine frees its blocks at the next step."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        eng = self.model.engine
        put = lambda item: loop.call_soon_threadsafe(queue.put_nowait, item)  # noqa: E731
        tracker = generation.Tracker(self.model.tokenizer, job, lambda ev: put(("text", ev)))
        req = tracker.request(on_done=lambda: put(("done", None)))
        if job.cancel.is_set():  # the client left before the request reached the engine
            out = generation.Outcome(finish_reason="cancelled", prompt_tokens=len(job.prompt), cancelled=True)
            yield "done", out
            return
        try:
            eng.submit(req)
        except InfrError as e:
            raise APIError(400, str(e)) from None
        delivered = False
        held: list = []  # an item taken while merging, handled next
        try:
            while True:
                kind, value = held.pop() if held else await queue.get()
                if kind == "text":
                    # The engine hands over several tokens per step (the multi-step decode): what is
                    # queued goes out as one event, so each chunk costs the server once, not per token.
                    while not queue.empty():
                        more = queue.get_nowait()
                        if more[0] != "text":
                            held.append(more)
                            break
                        value = {"text": value["text"] + more[1]["text"],
                                 "logprobs": value["logprobs"] + more[1]["logprobs"]}
                if kind == "done":
                    if req.finish_reason == "error":
                        delivered = True  # counted as an error, not as a cancellation
                        log.error("generation failed: %s", req.error)
                        raise APIError(500, f"generation failed: {req.error}")
                    out, tail = tracker.outcome(req)
                    if tail is not None:
                        yield "text", tail
                    self.metrics.finished(out)
                    delivered = True
                    yield "done", out
                    return
                yield kind, value
        finally:
            if not delivered:  # the client left before the answer ended: stop it (if it still runs), count it
                job.cancel.set()
                if not req.done:
                    eng.cancel(req)
                self.metrics.finished(generation.Outcome(
                    finish_reason="cancelled", prompt_tokens=len(job.prompt), reused_tokens=req.cached_tokens or 0,
                    completion_tokens=len(req.output), cancelled=True))


def new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def usage(outcome: generation.Outcome) -> dict:
    return {"prompt_tokens": outcome.prompt_tokens, "completion_tokens": outcome.completion_tokens,
            "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": outcome.reused_tokens}}


def _plain(obj) -> dict:
    import msgspec

    return msgspec.to_builtins(obj)


def timings(outcome: generation.Outcome) -> dict:
    """llama-server's `timings` object: prompt from submission to the first token, generation
    from the first token to the last (predicted_n counts the first token, as llama-server's)."""
    prompt_n = outcome.prompt_tokens - outcome.reused_tokens
    gen, n = outcome.gen_seconds, outcome.completion_tokens
    return {"cache_n": outcome.reused_tokens, "prompt_n": prompt_n, "prompt_ms": outcome.ttft * 1e3,
            "prompt_per_second": prompt_n / outcome.ttft if outcome.ttft > 0 else 0.0,
            "predicted_n": n, "predicted_ms": gen * 1e3, "predicted_per_second": n / gen if gen > 0 else 0.0}
