"""WGSL loading, the pipeline cache, buffers and one-shot dispatch helpers.

Kernels live in `wgsl/NAME.wgsl`. A source may hold `{{KEY}}` placeholders,
filled from the constants a pipeline is asked for (the "small template step":
workgroup sizes, the quant type's block reader). One compiled pipeline per
(file, entry, constants), built once per process and shared by every model.
Q8_ROUND (the activation rounding, infr.numerics.ROUNDINGS) is the one constant
with a default, infr's: a plan that asks for another gets a view of the cache
that passes it to every pipeline (Kernels.rounding).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
import importlib.util
from pathlib import Path
from typing import Sequence

import numpy as np

from infr.gpu.device import Device
from infr.numerics import INFR, check_rounding

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# Q8_ROUND picks the kernels' 8-bit rounding: wgsl/q8_round_*, q8_head_*, gemm_q8_* (docs/numerics.md).
DEFAULT_CONSTS = {"Q8_ROUND": INFR}


def wgsl_dir() -> Path:
    here = Path(__file__).resolve().parents[2] / "wgsl"
    if here.is_dir():  # a source checkout or editable install
        return here
    spec = importlib.util.find_spec("infr._wgsl")  # an installed wheel: a data-only package
    return Path(list(spec.submodule_search_locations)[0])


def load_source(name: str, consts: dict[str, object] | None = None) -> str:
    return render_source((wgsl_dir() / f"{name}.wgsl").read_text(), consts, name)


_INCLUDE = re.compile(r"^//\s*#include\s+(\w+)\s*$", re.MULTILINE)


def render_source(src: str, consts: dict[str, object] | None = None, name: str = "<source>") -> str:
    """Fill `{{KEY}}` placeholders, then expand `// #include other` lines.

    Placeholders go first so `// #include quant_{{QTYPE}}` names a real file.
    Includes are recursive (a quant reader includes quant_common) and each file
    is pulled in once per final source: WGSL rejects a function defined twice.
    """
    consts = {**DEFAULT_CONSTS, **(consts or {})}
    seen: set[str] = set()

    def fill(text: str, where: str) -> str:
        def one(m: re.Match) -> str:
            if m[1] not in consts:
                raise KeyError(f"{where}.wgsl needs constant {m[1]}")
            return str(consts[m[1]])

        return _PLACEHOLDER.sub(one, text)

    def expand(text: str) -> str:
        def include(m: re.Match) -> str:
            if m[1] in seen:
                return f"// (already included: {m[1]})"
            seen.add(m[1])
            return expand(fill((wgsl_dir() / f"{m[1]}.wgsl").read_text(), m[1]))

        return _INCLUDE.sub(include, text)

    return expand(fill(src, name))


class Kernels:
    """Pipeline cache for one device."""

    q8_rounding = INFR  # how the kernels that round activations round them (rounding())

    def __init__(self, dev: Device):
        self.dev = dev
        self._cache: dict[tuple, object] = {}
        self._by_source: dict[tuple, object] = {}  # (code, entry, unchecked) -> pipeline: one per source
        self._views: dict[str, Kernels] = {INFR: self}
        self.compile_seconds = 0.0

    def rounding(self, mode: str) -> "Kernels":
        """These kernels with activations rounded `mode`'s way (numerics.ROUNDINGS): the same
        device and compiled pipelines, Q8_ROUND = mode passed to every pipeline asked for (one
        that does not read it renders the same source, so it is not compiled twice). One view per
        mode, kept here: caches keyed by a Kernels (scratch buffers) see one object per mode."""
        view = self._views.get(check_rounding(mode))
        if view is None:
            view = self._views[mode] = copy.copy(self)  # shares the dicts above
            view.q8_rounding = mode
        return view

    def pipeline(self, name: str, entry: str = "main", unchecked: bool = False, **consts: object):
        """The compiled `entry` of wgsl/NAME.wgsl; `unchecked`: without wgpu's
        runtime checks (see unchecked_module), for kernels whose every index is
        in range by construction."""
        if self.q8_rounding != INFR:
            consts.setdefault("Q8_ROUND", self.q8_rounding)
        key = (name, entry, unchecked, tuple(sorted(consts.items())))
        pipe = self._cache.get(key)
        if pipe is None:
            code = load_source(name, consts)
            pipe = self._cache[key] = self._compile(name, entry, unchecked, code)
        return pipe

    def _compile(self, name: str, entry: str, unchecked: bool, code: str):
        pipe = self._by_source.get((code, entry, unchecked))
        if pipe is None:
            import time

            t0 = time.perf_counter()
            if self.dev.dawn:
                # Tint wants the enables naga refuses; Dawn's robustness is off device-wide
                # (device.DAWN_TOGGLES), so `unchecked` needs nothing more there.
                module = self.dev.device.create_shader_module(label=name, code=dawn_source(code))
            elif unchecked:
                module = unchecked_module(self.dev.device, name, naga_source(code))
            else:
                module = self.dev.device.create_shader_module(label=name, code=naga_source(code))
            pipe = self._by_source[(code, entry, unchecked)] = self.dev.device.create_compute_pipeline(
                label=f"{name}:{entry}", layout="auto", compute={"module": module, "entry_point": entry}
            )
            self.compile_seconds += time.perf_counter() - t0
        return pipe

    def bind(self, pipeline, resources_: Sequence[object]):
        """Bind group 0: binding i gets resources_[i] (a buffer or a (buffer, offset, size) triple;
        None: a binding the pipeline does not declare)."""
        entries = []
        for i, res in enumerate(resources_):
            if res is None:
                continue
            if isinstance(res, tuple):
                buf, offset, size = res
                entries.append({"binding": i, "resource": {"buffer": buf, "offset": offset, "size": size}})
            else:
                entries.append({"binding": i, "resource": {"buffer": res, "offset": 0, "size": res.size}})
        return self.dev.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)


_F16 = re.compile(r"\bf16\b|vec[234]h\b")
_SUBGROUP = re.compile(r"\bsubgroup[A-Z]\w*\s*\(|@builtin\(\s*subgroup_")


def dawn_source(code: str) -> str:
    """A kernel as Tint takes it: `enable f16;` / `enable subgroups;` before sources that use
    them (naga rejects the subgroups enable, so the .wgsl files leave both out)."""
    enables = [e for e, pat in (("f16", _F16), ("subgroups", _SUBGROUP))
               if pat.search(code) and not re.search(rf"^\s*enable\s+{e}\s*;", code, re.MULTILINE)]
    return "".join(f"enable {e};\n" for e in enables) + code


def naga_source(code: str) -> str:
    """A kernel as naga takes it: `enable f16;` before sources whose code (not only comments) uses
    f16 values (mma_dequant.wgsl: the tensor-core tiles' f16 weight rows, checked on lavapipe)."""
    if _F16.search(re.sub(r"//[^\n]*", "", code)) and not re.search(r"^\s*enable\s+f16\s*;", code, re.MULTILINE):
        return "enable f16;\n" + code
    return code


def unchecked_module(device, label: str, code: str):
    """A WGSL module compiled without wgpu's runtime checks: no clamping of
    array indices and no iteration counter in every loop (naga adds both by
    default). wgpu-native's wgpuDeviceCreateShaderModuleTrusted, which the
    wgpu Python API does not wrap, so it is called through its FFI."""
    from wgpu.backends.wgpu_native import _api
    from wgpu.backends.wgpu_native._ffi import ffi, lib

    src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
    src[0].chain.next = ffi.NULL
    src[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    desc = _api.new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=ffi.cast("WGPUChainedStruct *", src),
                             label=_api.to_c_string_view(label))
    checks_none = 0  # WGPUShaderRuntimeChecks_None
    handle = _api.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, checks_none)
    if handle == ffi.NULL:
        raise RuntimeError(f"shader module {label!r} creation failed")
    return _api.GPUShaderModule(label, handle, device)


@dataclass
class Dispatch:
    pipeline: object
    bind_group: object
    groups: tuple[int, int, int]
    label: str = ""  # kernel and shape, e.g. "gemv_q4_k 4096x14336": the profiler's row
    bytes: int = 0   # weight bytes it reads (the profiler's GB/s); 0 when not a weight op


def storage(dev: Device, data: np.ndarray | int, label: str = "", uniform: bool = False, tail: int = 0):
    """A storage (or uniform) buffer holding `data`, or `data` bytes of zeros; sizes padded to 16,
    plus `tail` bytes of zeros (weights: kernels_matmul.WEIGHT_TAIL)."""
    BU = dev.api.BufferUsage
    usage = BU.COPY_DST | BU.COPY_SRC
    usage |= BU.UNIFORM if uniform else BU.STORAGE
    if isinstance(data, int):
        return dev.device.create_buffer(label=label, size=max(16, _pad(data)), usage=usage)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    buf = dev.device.create_buffer(label=label, size=max(16, _pad(raw.nbytes) + tail), usage=usage)
    if raw.nbytes:
        padded = raw if raw.nbytes % 4 == 0 else np.concatenate([raw, np.zeros(4 - raw.nbytes % 4, np.uint8)])
        dev.device.queue.write_buffer(buf, 0, padded)
    return buf


def _pad(n: int) -> int:
    return (n + 15) // 16 * 16


_RAW: dict[str, tuple | None] = {}


def raw_calls(flavor: str) -> tuple | None:
    """(NULL, SetPipeline, SetBindGroup, DispatchWorkgroups) of the implementation's C API
    through its wgpu-py module's own cffi handles (both share webgpu.h's names), or None
    where they cannot be had (the portable API is used then)."""
    if flavor not in _RAW:
        try:
            if flavor == "dawn":
                from wgpudawn.backends.dawn._api import ffi, lib
            else:
                from wgpu.backends.wgpu_native._api import ffi, lib
            _RAW[flavor] = (ffi.NULL, lib.wgpuComputePassEncoderSetPipeline,
                            lib.wgpuComputePassEncoderSetBindGroup, lib.wgpuComputePassEncoderDispatchWorkgroups)
        except Exception:
            _RAW[flavor] = None
    return _RAW[flavor]


class Recording:
    """A flat list of dispatches prepared for re-encoding token after token.

    The Python API costs ~5-7 us per dispatch (argument checks, keep-alive
    bookkeeping); calling the C functions on the raw handles costs a third of
    that. Objects stay alive through `dispatches`, so skipping wgpu-py's
    keep-alive is safe. Consecutive dispatches of one pipeline set it once.
    """

    def __init__(self, dispatches: Sequence[Dispatch]):
        self.dispatches = list(dispatches)
        # The implementation is the one that made the pipelines: handles of one passed to the
        # other's C functions would crash, so it is read off the objects, not passed in.
        dawn = bool(self.dispatches) and type(self.dispatches[0].pipeline).__module__.startswith("wgpudawn")
        self.calls = raw_calls("dawn" if dawn else "wgpu")
        self.raw = [(d.pipeline._internal, d.bind_group._internal, *d.groups) for d in self.dispatches] \
            if self.calls else None
        self._parts: dict[int, list[Recording]] = {}

    def parts(self, k: int) -> list["Recording"]:
        """This recording as at most k consecutive recordings of near-equal length (made once per k)."""
        if k not in self._parts:
            n = len(self.dispatches)
            cuts = sorted({n * i // k for i in range(k + 1)})
            self._parts[k] = [Recording(self.dispatches[a:b]) for a, b in zip(cuts[:-1], cuts[1:])] or [self]
        return self._parts[k]

    def __len__(self) -> int:
        return len(self.dispatches)

    def encode(self, cpass, times: int = 1, timer=None) -> None:
        """Encode the dispatches `times` times. With a profiler `timer`
        (infr.gpu.profile), a timestamp is written before the first dispatch
        and after each one."""
        if timer is not None:
            return self._encode_timed(cpass, times, timer)
        if self.raw is None:
            for _ in range(times):
                for d in self.dispatches:
                    cpass.set_pipeline(d.pipeline)
                    cpass.set_bind_group(0, d.bind_group)
                    cpass.dispatch_workgroups(*d.groups)
            return
        h, last = cpass._internal, None
        null, set_pipeline, set_bind_group, dispatch = self.calls
        for _ in range(times):
            for pipe, bg, x, y, z in self.raw:
                if pipe is not last:
                    set_pipeline(h, pipe)
                    last = pipe
                set_bind_group(h, 0, bg, 0, null)
                dispatch(h, x, y, z)

    def encode_passes(self, enc, times: int = 1, timer=None) -> None:
        """Encode into `enc`: one pass, or with a per-pass profiler timer each dispatch in a pass of
        its own between two timestamps (Dawn's profile; encode_all)."""
        encode_all(enc, [(self, times)], timer)

    def _encode_timed(self, cpass, times: int, timer) -> None:
        qs = timer.query_set
        cpass._write_timestamp(qs, timer.take(self.dispatches[0] if self.dispatches else None, first=True))
        for _ in range(times):
            for d in self.dispatches:
                cpass.set_pipeline(d.pipeline)
                cpass.set_bind_group(0, d.bind_group)
                cpass.dispatch_workgroups(*d.groups)
                cpass._write_timestamp(qs, timer.take(d))


def run(dev: Device, dispatches: Sequence[Dispatch]) -> None:
    """Encode the dispatches in one compute pass and submit (tests and one-off work)."""
    enc = dev.device.create_command_encoder()
    cp = enc.begin_compute_pass()
    for d in dispatches:
        cp.set_pipeline(d.pipeline)
        cp.set_bind_group(0, d.bind_group)
        cp.dispatch_workgroups(*d.groups)
    cp.end()
    dev.device.queue.submit([enc.finish()])


def read(dev: Device, buf, dtype=np.float32, count: int | None = None) -> np.ndarray:
    out = np.frombuffer(dev.device.queue.read_buffer(buf), dtype=dtype)
    return out[:count] if count is not None else out


def encode_all(enc, parts, timer=None) -> None:
    """Encode the (recording, times) parts into `enc` in order: in one compute pass, or with a per-pass
    profiler timer each dispatch in a pass of its own between two timestamps (Dawn has no in-pass
    timestamps: infr.gpu.profile.Timer.per_pass)."""
    if timer is None or not timer.per_pass:
        cpass = enc.begin_compute_pass()
        for rec, times in parts:
            rec.encode(cpass, times, timer)
        cpass.end()
        return
    for rec, times in parts:
        for _ in range(times):
            for d in rec.dispatches:
                b = timer.take(d, first=True)
                cpass = enc.begin_compute_pass(timestamp_writes={
                    "query_set": timer.query_set, "beginning_of_pass_write_index": b,
                    "end_of_pass_write_index": timer.take(d)})
                cpass.set_pipeline(d.pipeline)
                cpass.set_bind_group(0, d.bind_group)
                cpass.dispatch_workgroups(*d.groups)
                cpass.end()
