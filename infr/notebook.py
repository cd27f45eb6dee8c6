"""Helpers for the notebooks in notebooks/: live plots, load progress, a
profiled generation and the checks the notebooks assert.

Live plots are matplotlib figures rendered to PNG into an IPython display
handle that is updated in place (`display(..., display_id=True)`, then
`.update()`): that works in JupyterLab, VS Code and headless under nbclient,
and the saved notebook keeps the last frame as a static image. pyplot is not
used, so no GUI backend is needed and nothing is shown twice.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field

import numpy as np

# --- live plots


class LivePlot:
    """A grid of axes shown once and redrawn in place; `updates` counts the redraws pushed to the display."""

    def __init__(self, nrows: int = 1, ncols: int = 1, figsize=(10, 4), dpi: int = 80):
        from matplotlib.figure import Figure

        self.fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        self.axes = list(self.fig.subplots(nrows, ncols, squeeze=False).ravel())
        self.updates = 0
        self._handle = None

    def png(self) -> bytes:
        buf = io.BytesIO()
        self.fig.savefig(buf, format="png")
        return buf.getvalue()

    def show(self) -> LivePlot:
        from IPython.display import Image, display

        self._handle = display(Image(self.png()), display_id=True)
        return self

    def update(self) -> None:
        """Push the current figure to the display (a no-op outside IPython)."""
        if self._handle is None:
            return
        from IPython.display import Image

        self._handle.update(Image(self.png()))
        self.updates += 1


# --- load progress


def tqdm_progress():
    """A `progress(stage, done, total)` callback for `Model(..., progress=...)`:
    one tqdm bar per stage (a widget in Jupyter, text elsewhere)."""
    from tqdm.auto import tqdm

    bars: dict = {}
    closed: set = set()
    desc = {"upload": "upload weights", "graph": "compile pipelines, build the decode graph"}

    def report(stage: str, done: int, total: int) -> None:
        bar = bars.get(stage)
        if bar is None:
            nbytes = stage == "upload"
            bar = bars[stage] = tqdm(total=total, desc=desc.get(stage, stage), unit="B" if nbytes else "op",
                                     unit_scale=nbytes, unit_divisor=1024 if nbytes else 1000)
        if stage in closed:
            return
        n = bar.total if done >= total else round(done / total * bar.total)  # the last call may use other units
        bar.update(n - bar.n)
        if n >= bar.total:
            bar.close()
            closed.add(stage)

    return report


def load_model(ref: str, backend: str = "gpu", n_ctx: int = 512, progress=True):
    """A Model from an offline name, a .gguf path, a Hugging Face ref or synth:PRESET[:TYPE],
    with progress bars for the weight upload and the pipeline compilation."""
    from infr.bench import model_path
    from infr.engine import Model

    return Model(model_path(ref), n_ctx=n_ctx, backend=backend, progress=tqdm_progress() if progress else None)


# --- a profiled generation


@dataclass
class Step:
    kind: str           # "prefill" or "decode"
    start: int          # context length before the step
    tokens: int         # tokens the forward pass ran
    wall_s: float       # host clock around the synchronous forward call (write, encode, submit, read back)
    at_s: float         # seconds since the run began, at the end of the step
    result: object      # the step's infr.gpu.profile.ProfileResult

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def context(self) -> int:
        return self.start + self.tokens


@dataclass
class ProfiledRun:
    prompt_tokens: int
    steps: list[Step] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def gpu_us(self) -> float:
        """Sum of every timed dispatch of the run."""
        return sum(s.result.gpu_us for s in self.steps)

    @property
    def wall_us(self) -> float:
        """Host clock around every forward call (graph builds and encoding included)."""
        return sum(s.wall_s for s in self.steps) * 1e6

    @property
    def sync_us(self) -> float:
        """Host clock from each submit until its logits were read back (the profiler's
        submit + wait counters): the GPU's busy time plus one readback per call."""
        return sum(s.result.host_us.get("submit", 0.0) + s.result.host_us.get("wait", 0.0) for s in self.steps)

    def by_kernel(self) -> dict[str, float]:
        """µs per kernel name over the whole run."""
        out: dict[str, float] = {}
        for s in self.steps:
            for k, us in s.result.by_kernel().items():
                out[k] = out.get(k, 0.0) + us
        return out

    def by_label(self) -> dict[str, dict]:
        """Per kernel-and-shape label: count, µs and weight bytes read, over the whole run."""
        out: dict[str, dict] = {}
        for s in self.steps:
            for r in s.result.rows:
                a = out.setdefault(r.label, {"kernel": r.kernel, "count": 0, "us": 0.0, "bytes": 0.0})
                a["count"] += r.count
                a["us"] += r.total_us
                a["bytes"] += (r.gbps or 0.0) * r.total_us * 1e3  # GB/s = bytes per ns
        return out

    def gbps(self) -> dict[str, float]:
        """Achieved weight GB/s per weight-reading label."""
        return {k: a["bytes"] / (a["us"] * 1e3) for k, a in self.by_label().items() if a["bytes"] and a["us"]}


def profiled_generate(model, prompt: list[int], n_new: int, on_step=None) -> ProfiledRun:
    """Greedy generation, each forward pass in its own `profile()` so the per-kernel
    times arrive step by step; `on_step(run)` after each. EOS does not stop it: the
    point is a fixed number of steps."""
    import infr.gpu.profile as P

    session = model.session()
    run = ProfiledRun(len(prompt))
    t0 = time.perf_counter()

    def step(kind: str, start: int, n: int, call):
        with P.profile() as p:
            a = time.perf_counter()
            logits = call()
            wall = time.perf_counter() - a  # before the profile reads its timestamps back
        run.steps.append(Step(kind, start, n, wall, time.perf_counter() - t0, p.result))
        if on_step is not None:
            on_step(run)
        return logits

    logits = step("prefill", 0, len(prompt), lambda: session.prefill(prompt))
    for i in range(n_new):
        tok = int(np.argmax(logits))
        run.tokens.append(tok)
        if i < n_new - 1:
            logits = step("decode", len(session.tokens), 1, lambda t=tok: session.decode(t))
    return run


def prompt_of_length(tokenizer, n: int, text: str | None = None) -> list[int]:
    """n token ids of ordinary text (repeated as needed), after the tokenizer's BOS."""
    text = text or ("The quick brown fox jumps over the lazy dog while the river runs past the old mill. "
                    "Engineers measure what they change, and write down why. ")
    ids = tokenizer.encode(text, add_special=True)
    body = tokenizer.encode(text, add_special=False)
    while len(ids) < n:
        ids += body
    return ids[:n]


def draw_profile(live: LivePlot, run: ProfiledRun, bandwidth_gbps: float | None, top: int = 10) -> None:
    """Four panels: tok/s over time and over context length, per-kernel time, achieved GB/s."""
    ax_time, ax_ctx, ax_kern, ax_bw = live.axes
    for ax in live.axes:
        ax.clear()
    dec = [s for s in run.steps if s.kind == "decode"]
    pre = [s for s in run.steps if s.kind == "prefill"]
    ax_time.plot([s.at_s for s in dec], [s.tok_s for s in dec], "o-", ms=3, label="decode")
    ax_time.plot([s.at_s for s in pre], [s.tok_s for s in pre], "s", label="prefill")
    ax_time.set(title="tok/s over time", xlabel="s since start", ylabel="tok/s")
    ax_time.legend(loc="best", fontsize=8)
    ax_ctx.plot([s.context for s in dec], [s.tok_s for s in dec], "o-", ms=3)
    ax_ctx.set(title="decode tok/s over context length", xlabel="context (tokens)", ylabel="tok/s")
    kern = sorted(run.by_kernel().items(), key=lambda kv: kv[1])[-top:]
    ax_kern.barh([k for k, _ in kern], [us / 1e3 for _, us in kern])
    ax_kern.set(title=f"GPU time per kernel ({len(run.steps)} steps)", xlabel="ms")
    ax_kern.tick_params(axis="y", labelsize=7)
    bw = sorted(run.gbps().items(), key=lambda kv: kv[1])[-top:]
    ax_bw.barh([k for k, _ in bw], [g for _, g in bw], color="tab:green")
    if bandwidth_gbps:
        ax_bw.axvline(bandwidth_gbps, color="tab:red", ls="--", label=f"adapter read {bandwidth_gbps:.1f} GB/s")
        ax_bw.legend(loc="lower right", fontsize=8)
    ax_bw.set(title="achieved weight GB/s", xlabel="GB/s")
    ax_bw.tick_params(axis="y", labelsize=7)


# --- what the notebooks assert

# Plan op -> the kernel names that carry it out, fused ones included: the backend
# fuses the residual add into the matmul epilogue, rope with the KV store, and
# gate||up with its activation (docs/gpu_kernels.md), so those ops have no kernel
# of their own; a prefix names a kernel family (matmul_q4_1, attn_tiled, ...).
FAMILY_KERNELS = {
    "Embed": ("embed",),
    "RMSNorm": ("rmsnorm",),
    "MatMul": ("matmul", "gemv", "gemm"),
    "Rope": ("rope",),
    "StoreKV": ("kv_store", "rope_kv"),
    "Attention": ("attention", "attn"),
    "GatedAct": ("gated", "*gate_up"),
    "Add": ("add", "matmul", "gemv", "gemm"),
    "Softcap": ("softcap",),
}


def _matches(kernel: str, pattern: str) -> bool:
    return pattern[1:] in kernel if pattern.startswith("*") else kernel.startswith(pattern)


def plan_families(plan) -> list[str]:
    """The op families (op class names) of a plan, in first-use order."""
    seen: dict[str, None] = {}
    for op in plan.ops:
        seen.setdefault(type(op).__name__, None)
    return list(seen)


def family_coverage(plan, kernels) -> dict[str, list[str]]:
    """For each op family of the plan, the profiled kernels that carry it out (empty: none ran)."""
    return {fam: sorted(k for k in kernels if any(_matches(k, p) for p in FAMILY_KERNELS.get(fam, ())))
            for fam in plan_families(plan)}
