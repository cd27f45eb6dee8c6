"""Counters for `/metrics` in Prometheus' text format: requests, tokens, and the engine's
running and waiting sequences, KV blocks, prefix-cache hits, a recurrent model's state checkpoints,
sliding-window KV checkpoints, batch sizes and step time."""

from __future__ import annotations


class Metrics:
    """Counters for `/metrics` in Prometheus' text format."""

    def __init__(self):
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.generated_tokens = 0
        self.cancelled = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.gen_seconds = 0.0

    def request(self, endpoint: str) -> None:
        self.requests[endpoint] = self.requests.get(endpoint, 0) + 1

    def error(self, status: int) -> None:
        key = str(status)
        self.errors[key] = self.errors.get(key, 0) + 1

    def finished(self, outcome) -> None:
        self.prompt_tokens += outcome.prompt_tokens
        self.reused_tokens += outcome.reused_tokens
        self.generated_tokens += outcome.completion_tokens
        if outcome.cancelled:
            self.cancelled += 1
        if outcome.completion_tokens or outcome.ttft:
            self.ttft_sum += outcome.ttft
            self.ttft_count += 1
        self.gen_seconds += outcome.gen_seconds

    def render(self, engine=None) -> str:
        """engine: the model's Scheduler (infr/scheduler.py), once loaded."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP infr_{name} {help_}")
            lines.append(f"# TYPE infr_{name} {kind}")
            for labels, value in samples:
                lines.append(f"infr_{name}{labels} {value:g}")

        metric("requests_total", "counter", "Requests received, by endpoint.",
               [(f'{{endpoint="{k}"}}', v) for k, v in sorted(self.requests.items())] or [("", 0)])
        metric("errors_total", "counter", "Error responses, by status.",
               [(f'{{status="{k}"}}', v) for k, v in sorted(self.errors.items())] or [("", 0)])
        metric("prompt_tokens_total", "counter", "Prompt tokens processed (cached ones included).",
               [("", self.prompt_tokens)])
        metric("prompt_tokens_reused_total", "counter", "Prompt tokens served from the KV cache.",
               [("", self.reused_tokens)])
        metric("generated_tokens_total", "counter", "Tokens generated.", [("", self.generated_tokens)])
        metric("requests_cancelled_total", "counter", "Generations stopped because the client left.",
               [("", self.cancelled)])
        metric("time_to_first_token_seconds", "summary", "Time from slot start to the first token.",
               [("_sum", self.ttft_sum), ("_count", self.ttft_count)])
        rate = self.generated_tokens / self.gen_seconds if self.gen_seconds > 0 else 0.0
        metric("tokens_per_second", "gauge", "Mean decode rate over all requests.", [("", rate)])
        if engine is not None:
            st, pool = engine.stats, engine.pool
            metric("requests_running", "gauge", "Sequences in the running batch.", [("", len(engine.running))])
            metric("requests_waiting", "gauge", "Requests waiting for a slot or KV blocks.",
                   [("", len(engine.waiting))])
            metric("kv_blocks", "gauge", f"KV cache blocks ({pool.block_size} tokens each), by state.",
                   [('{state="used"}', pool.used), ('{state="free"}', pool.free),
                    ('{state="cached"}', pool.cached)])
            metric("kv_blocks_evicted_total", "counter", "Cached KV blocks evicted for new ones.", [("", pool.evicted)])
            win = engine.window_pool
            if win is not None:  # sliding-window layers: their own pool, blocks given back past the window
                metric("kv_window_blocks", "gauge", f"KV cache blocks of the sliding-window layers ({win.block_size} "
                       "tokens each), by state.", [('{state="used"}', win.used), ('{state="free"}', win.free),
                                                  ('{state="cached"}', win.cached), ('{state="pinned"}', win.pinned)])
                metric("kv_window_blocks_evicted_total", "counter", "Cached sliding-window KV blocks evicted.",
                       [("", win.evicted)])
            metric("prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache.",
                   [("", st.prefix_hit_tokens)])
            wck = engine.window_checkpoints
            if wck is not None:  # the window layers' last windows pinned for prefix reuse (infr/checkpoints.py)
                metric("swa_checkpoints", "gauge", "Sliding-window KV checkpoints kept for prefix reuse.",
                       [("", wck.count)])
                metric("swa_checkpoint_bytes", "gauge", "Window-store memory the checkpoints pin, and the most "
                       "their count allows.", [('{state="used"}', wck.bytes), ('{state="budget"}', wck.budget_bytes)])
                metric("swa_checkpoints_total", "counter", "Sliding-window KV checkpoints, by event.",
                       [('{event="saved"}', wck.saved), ('{event="restored"}', wck.restored),
                        ('{event="evicted"}', wck.evicted)])
            ck = engine.checkpoints
            if ck is not None:  # a recurrent model: its state's snapshots for prefix reuse (infr/checkpoints.py)
                metric("recurrent_state_bytes_per_sequence", "gauge", "Bytes of one sequence's recurrent state, "
                       "and of each of its checkpoints.", [("", ck.bytes_per_snapshot)])
                metric("recurrent_checkpoints", "gauge", "Recurrent state checkpoints kept for prefix reuse.",
                       [("", ck.count)])
                metric("recurrent_checkpoint_bytes", "gauge", "Memory of the recurrent state checkpoints, and "
                       "their budget.", [('{state="used"}', ck.bytes), ('{state="budget"}', ck.budget_bytes)])
                metric("recurrent_checkpoints_total", "counter", "Recurrent state checkpoints, by event.",
                       [('{event="saved"}', ck.saved), ('{event="restored"}', ck.restored),
                        ('{event="evicted"}', ck.evicted)])
            metric("preemptions_total", "counter", "Requests preempted (blocks freed, recomputed later).",
                   [("", st.preemptions)])
            metric("engine_steps_total", "counter", "Engine steps (one batch each).", [("", st.steps)])
            metric("batch_rows_total", "counter", "Rows run, summed over steps (decode and prefill).",
                   [('{kind="decode"}', st.decode_rows), ('{kind="prefill"}', st.prefill_rows)])
            metric("batch_rows_max", "gauge", "Largest batch so far, in rows.", [("", st.max_rows)])
            metric("batch_size_steps", "counter", "Steps by batch size (rows, rounded up to a power of two).",
                   [(f'{{rows="{k}"}}', v) for k, v in sorted(st.batch_sizes.items())] or [("", 0)])
            metric("step_seconds", "summary", "Time in backend steps.", [("_sum", st.step_seconds),
                                                                          ("_count", st.steps)])
        return "\n".join(lines) + "\n"
