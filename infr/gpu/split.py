"""One model across several devices: a layer split (`--split-mode layer`, infr/split.py).

The plan's layers are cut into contiguous ranges (split.stages: llama.cpp's assignment); each range
is a plan of its own (Plan.part) run by a GPUBackend on its device, with its own weights, KV store,
recurrent state, pipelines and bind groups, so nothing on one device binds another's buffers. The
first part also embeds the tokens, the last also runs the head and samples. A step runs the parts
in order: each writes the batch's ids, rows and block tables to its device, runs its layers, and
copies the carried values (Plan.carried: the residual stream rows [T, n_embd], and gemma4's
per-layer inputs) into a mapped staging buffer in the same submit; the host reads them back and
writes them into the next part's input buffers ahead of its submit. One hand-over per part per step.

The GPU-resident decode loop (decode_steps: many steps per submit, tokens never leave the device)
would need the sampled token to reach the first device inside a submit, which no WebGPU queue can
do across devices: a split runs one step per call (multi_step = 1) and the engine calls step().
The single-device backend is untouched by this: it never takes these paths.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator

import numpy as np

from infr.batch import Batch, StepResult
from infr.errors import InfrError, UnsupportedError
from infr.gguf_file import GGUFFile
from infr.gpu import kernels_attention as KA
from infr.gpu import kernels_misc as KS
from infr.gpu.backend import MAX_BATCH, GPUBackend, _bucket, forward_chunks
from infr.gpu.device import Device, distinct_adapters, get_devices
from infr.kvpool import KVBudget
from infr.ops import Attention
from infr.plan import Plan, bind
from infr.sampling import SamplingParams
from infr.split import SplitOptions, stages

_NOTED: set[str] = set()  # notes said once per process on stderr


def make_split(gf: GGUFFile, plan: Plan, n_ctx: int, opts: SplitOptions, flavor: str = "wgpu",
               **kw) -> "GPUBackend | SplitBackend":
    """The backend of a layer split over the devices opts names: a SplitBackend where more than
    one device holds layers, else one GPUBackend on the device that holds them all."""
    props = opts.tensor_split or (1.0,) * len(distinct_adapters(flavor))  # default: equal shares of each GPU
    parts = stages(plan.spec.n_layers, props)
    devs, note = get_devices(len(props), flavor, opts.same_adapter)
    layout = "layer split: " + "; ".join(
        f"device {p.device}: " + ({0: "no layers", 1: f"layer {p.first}"}.get(p.last - p.first)
                                  or f"layers {p.first}-{p.last - 1}")
        + (" and the output" if p.head else "") for p in parts)
    for line in (note, layout):
        if line and line not in _NOTED:
            _NOTED.add(line)
            print(f"infr: {line}", file=sys.stderr)
    if len(parts) == 1:
        return GPUBackend(gf, plan, n_ctx, dev=devs[parts[0].device], **kw)
    return SplitBackend(gf, plan, n_ctx, [(devs[p.device], p) for p in parts], **kw)


class SplitBackend:
    """The engine's Backend (infr/backends.py) over parts of a plan on several devices."""

    multi_step = 1  # one step per call: the hand-over goes through the host (module docstring)
    max_rows = MAX_BATCH

    def __init__(self, gf: GGUFFile, plan: Plan, n_ctx: int, parts: list, progress=None, kv_blocks=None,
                 block_size: int = KS.BLOCK_SIZE, max_seqs: int = 64, batch_tokens: int | None = None,
                 cpu_moe: int = 0):
        if cpu_moe:
            raise UnsupportedError("--cpu-moe with --split-mode layer is not supported: run the experts on the "
                                   "GPUs of the split, or the model on one GPU")
        self.gf, self.n_ctx, self.block_size = gf, n_ctx, block_size
        self.plan = plan = bind(plan, gf)
        _check_placement(plan, [p for _, p in parts])
        plans = [plan.part(p.first, p.last, p.embed, p.head) for _, p in parts]
        built: dict[int, GPUBackend] = {}

        def build(i: int, blocks) -> None:
            built[i] = GPUBackend(gf, plans[i], n_ctx, dev=parts[i][0], progress=progress, kv_blocks=blocks,
                                  block_size=block_size, max_seqs=max_seqs, batch_tokens=batch_tokens)

        # The parts with KV layers size their stores (a KVBudget: from their adapter's memory, shared with the
        # other parts on it); the engine's block ids run up to the smallest, which a part without KV layers
        # must accept too.
        with_kv = [i for i, pl in enumerate(plans) if pl.kv] or list(range(len(plans)))
        budgets = _shared_budgets(kv_blocks, gf, plans, [d for d, _ in parts], with_kv)
        for i in with_kv:
            build(i, budgets[i])
        if budgets and isinstance(kv_blocks, KVBudget):  # the start-up report's line
            kv_blocks.note = budgets[with_kv[0]].note
        self.n_blocks = min(built[i].n_blocks for i in with_kv)
        self.n_window_blocks = min(built[i].n_window_blocks for i in with_kv)
        for i in range(len(plans)):
            if i not in built:
                build(i, self.n_blocks)
        self.stages: list[GPUBackend] = [built[i] for i in range(len(plans))]
        self.layers = [(p.first, p.last) for _, p in parts]  # each device's share, for reports and tests
        self.blocks_per_seq = self.stages[0].blocks_per_seq
        self.name = self.stages[-1].name
        self.dev: Device = self.stages[-1].dev  # where tokens are sampled
        self.devices = [s.dev for s in self.stages]
        self.vram = sum(s.vram for s in self.stages)
        # Per part but the last: the carried values it hands on and a mapped staging buffer for them.
        BU = self.dev.api.BufferUsage
        self._hand: list[tuple[tuple[str, ...], object]] = []
        for s, nxt in zip(self.stages, self.stages[1:]):
            names = tuple(name for name, _ in nxt.plan.inputs)
            size = MAX_BATCH * 4 * sum(nxt.widths[name] for name in names)
            self._hand.append((names, s.dev.device.create_buffer(size=size, usage=BU.MAP_READ | BU.COPY_DST,
                                                                  label="split hand-over")))

    @property
    def kv_bytes_per_token(self) -> int:
        return self.plan.kv_bytes_per_token()

    # --- a pass through the parts

    def _through(self, T: int, n: int, top: int, decode: bool, load: Callable[[GPUBackend], None],
                 last: Callable[[GPUBackend], object]):
        """Every part but the last: load(part) writes its ids, rows and tables, its layers run and
        hand their carried values to the next part; then last(the last part) runs and its result
        comes back. n live rows of T; top: the highest position (near or far attention)."""
        data = None
        for i, s in enumerate(self.stages[:-1]):
            if data is not None:
                self._hand_in(i, data)
            load(s)
            data = self._run_part(i, T, n, top, decode)
        self._hand_in(len(self.stages) - 1, data)
        return last(self.stages[-1])

    def _run_part(self, i: int, T: int, n: int, top: int, decode: bool) -> memoryview:
        s = self.stages[i]
        names, staging = self._hand[i]
        far = s._far(top, 1, T, decode)
        body, _, _ = s._graph(T, 0, far, decode)
        ends = s._ends(T, far, decode)
        enc = s._encode_body(s.dev.device.create_command_encoder(), body, None, n)
        off = 0
        for name in names:  # the live rows of each carried value, back to back
            nbytes = n * s.widths[name] * 4
            enc.copy_buffer_to_buffer(ends[name], 0, staging, off, nbytes)
            off += nbytes
        s.dev.device.queue.submit([enc.finish()])
        staging.map_async("READ", 0, off).sync_wait()
        data = bytes(staging.read_mapped(0, off))
        staging.unmap()
        return memoryview(data)

    def _hand_in(self, i: int, data: memoryview) -> None:
        """The carried values into part i's input buffers (the first half of each pair: where its
        graphs read them), queued ahead of its submit."""
        s = self.stages[i]
        n = len(data) // (4 * sum(s.widths[name] for name, _ in s.plan.inputs))
        off = 0
        for name, _ in s.plan.inputs:
            nbytes = n * s.widths[name] * 4
            s.dev.device.queue.write_buffer(s.buffers[name][0], 0, data[off:off + nbytes])
            off += nbytes

    # --- one sequence (tools and tests)

    def forward(self, tokens, start: int, n_logits: int = 1) -> np.ndarray:
        ids, n_logits, bounds = forward_chunks(self, tokens, start, n_logits)
        for s in self.stages:
            s._identity_table()
            if s.recurrent:
                s.recurrent.check_rows(np.arange(start, start + len(ids)), np.zeros(len(ids), np.int64))
        out = None
        for a, b in zip(bounds[:-1], bounds[1:]):
            chunk, pos = ids[a:b], np.arange(start + a, start + b)
            slots = np.zeros(b - a, np.uint32)

            def load(s: GPUBackend) -> None:
                s.dev.device.queue.write_buffer(s.ids, 0, chunk)
                KS.write_rows(s.dev, s.paging, pos, slots, b - a)

            out = self._through(b - a, b - a, start + b - 1, False, load,
                                lambda s: s._run(chunk, pos, slots, n_logits if b == len(ids) else 0))
            for s in self.stages:
                if s.recurrent:
                    s.recurrent.advance([start + b - 1], [0])
        return out

    def decode_greedy(self, token: int, start: int, n: int) -> list[int]:
        """n greedy steps of one sequence, one forward pass each (no GPU-resident loop on a split)."""
        out = [int(token)]
        for i in range(n):
            out.append(int(np.argmax(self.forward([out[-1]], start + i)[-1])))
        return out[1:]

    # --- the engine's step

    def step(self, batch: Batch) -> StepResult:
        """The batch through every part; the last samples as GPUBackend.step does (its checks run
        there; those a part before it would trip on run here first)."""
        n = batch.rows
        if not 1 <= n <= MAX_BATCH:
            raise InfrError(f"a step runs 1..{MAX_BATCH} rows, got {n}")
        if int(batch.tokens.max()) >= self.plan.spec.n_vocab or int(batch.tokens.min()) < 0:
            raise InfrError(f"token id out of range 0..{self.plan.spec.n_vocab - 1}")
        top = int(batch.positions.max())
        if top >= self.blocks_per_seq * self.block_size:
            raise InfrError(f"context full: position {top} is past {self.n_ctx}")
        T = _bucket(n)
        decode = int(np.bincount(batch.slots).max()) <= KA.SPLIT_MAX_T
        ran: list[GPUBackend] = []

        def load(s: GPUBackend) -> None:
            if s.recurrent:
                s.recurrent.check_rows(batch.positions, batch.slots)
            s._load_rows(batch, T)
            ran.append(s)

        res = self._through(T, n, top, decode, load, lambda s: s.step(batch))
        for s in ran:  # the last part advances its own in step()
            if s.recurrent:
                s.recurrent.advance(batch.positions, batch.slots)
        return res

    def decode_steps(self, batch: Batch, k: int, stop: Callable[[], bool] | None = None
                     ) -> Generator[list[int], None, None]:
        raise InfrError("a layer split runs one step per call (multi_step is 1): the engine calls step()")

    def samples(self, params: SamplingParams) -> bool:
        return self.stages[-1].samples(params)

    def warm(self, rows: int, far: bool = False) -> None:
        """Each part's graph of the decode step of `rows` rows: headless where a part hands on, the
        last part's with its logits, as step() takes them."""
        T = _bucket(rows)
        for s in self.stages:
            if not far or s._has_spans(T, True):
                s._graph(T, T if s is self.stages[-1] else 0, far, True)

    def free_memory(self) -> tuple[int, str] | None:
        """The least free memory of the split's devices."""
        free = [f for f in (s.free_memory() for s in self.stages) if f is not None]
        return min(free, default=None)

    # --- checkpoints of a recurrent model's state: each part keeps its own layers'

    def save_state(self, slot: int) -> object:
        return [s.save_state(slot) if s.recurrent else None for s in self.stages]

    def load_state(self, slot: int, snap: object, pos: int) -> None:
        for s, part in zip(self.stages, snap):
            if part is not None:
                s.load_state(slot, part, pos)


class _SharedBudget(KVBudget):
    """One part's `--kv-size` fraction where several parts of a split live on one adapter (devices of
    one GPU). Each sizing its store from the adapter's free memory would take the fraction once per
    part, more than asked for. Instead the free memory is read once, when the first of them sizes its
    store (less the weights of the others, not loaded yet), and each part takes the fraction in
    proportion to its share of the group's KV bytes per token: together they take it once, and each
    holds about the same number of blocks (the engine uses the least)."""

    def __init__(self, fraction: float, share: float, group: dict, others_weights: int, parts: int):
        super().__init__(fraction * share)
        self.whole, self.group, self.others_weights, self.parts = fraction, group, others_weights, parts

    def free_memory(self, backend) -> tuple[int, str] | None:
        if "free" not in self.group:
            free = backend.free_memory()
            self.group["free"] = None if free is None else (max(0, free[0] - self.others_weights), free[1])
        return self.group["free"]

    def describe(self, free: tuple[int, str]) -> str:
        if self.parts == 1:
            return super().describe(free)
        return (f"{self.whole:.0%} of {free[0] / 2**30:.1f} GiB free {free[1]} once the split's weights are in, "
                f"divided among its {self.parts} parts there")


def _shared_budgets(kv_blocks, gf: GGUFFile, plans: list[Plan], devs: list[Device], with_kv: list[int]) -> dict:
    """Each KV part's kv_blocks: as given (a number of blocks, or None), or for a KVBudget a
    _SharedBudget over the parts on the same adapter."""
    if not isinstance(kv_blocks, KVBudget):
        return {i: kv_blocks for i in with_kv}
    adapter = [(d.flavor, d.index) for d in devs]
    out = {}
    for key in dict.fromkeys(adapter[i] for i in with_kv):
        group = [i for i in with_kv if adapter[i] == key]
        per_token = {i: plans[i].kv_bytes_per_token() for i in group}
        total = sum(per_token.values())
        weights = {i: sum(gf.tensor(n).nbytes for n in plans[i].weights()) for i in range(len(plans))
                   if adapter[i] == key}  # parts without KV layers load theirs later too
        state: dict = {}
        for i in group:
            out[i] = _SharedBudget(kv_blocks.fraction, per_token[i] / total if total else 1 / len(group), state,
                                   sum(w for j, w in weights.items() if j != i), len(group))
    return out


def _check_placement(plan: Plan, parts) -> None:
    """A layer that reads another layer's KV cache (gemma4's KV sharing) must sit on its device."""
    where = {il: i for i, p in enumerate(parts) for il in range(p.first, p.last)}
    bounds = plan.layer_starts + (len(plan.layers),)
    for il in range(plan.spec.n_layers):
        for op in plan.layers[bounds[il]:bounds[il + 1]]:
            if isinstance(op, Attention) and where[op.layer] != where[il]:
                raise UnsupportedError(
                    f"--split-mode layer puts layer {il} on another GPU than layer {op.layer}, whose KV cache it "
                    f"reads (KV sharing); choose a --tensor-split that keeps them together")

