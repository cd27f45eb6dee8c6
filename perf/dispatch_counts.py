"""Dispatches of one decode step, per layer, for the synthetic presets of the real shapes (the
Q4_K_M mix, real widths, a few layers and a small vocabulary (8192 rows: still too many for the output norm
to run in the head's GEMV, kernels_norm_in, as with a real one), so it runs on any adapter, lavapipe
included): decode on the GPU is bound by dispatch count (perf/h200/decode-encode-vs-gpu-*), so this
count is the figure a kernel fusion moves. No timing: counts are exact on any machine.

    python perf/dispatch_counts.py                 # every preset below
    python perf/dispatch_counts.py qwen3-30b-a3b   # one, with its labels
"""
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from infr import synth  # noqa: E402
from infr.gguf_file import open_gguf  # noqa: E402
from infr.gpu.backend import GPUBackend  # noqa: E402
from infr.models import build_spec  # noqa: E402
from infr.plan import build_plan  # noqa: E402
from infr.synth_presets import PRESETS  # noqa: E402


def _g4(name, pattern, shared):
    return replace(PRESETS[name].gemma4, swa_pattern=pattern, shared_kv_layers=shared)


# One period of each family's layer pattern: (preset, overrides)
CASES = {
    "llama-3.2-1b": dict(n_layers=2),  # its norms run in the GEMVs after them (kernels_norm_in)
    "llama-3.1-8b": dict(n_layers=2),
    "qwen3-30b-a3b": dict(n_layers=2, n_expert=16),
    "qwen35-4b": dict(n_layers=4),  # three DeltaNet layers and one gated-attention layer
    "gemma4-e2b": dict(n_layers=5, gemma4=_g4("gemma4-e2b", (True, True, False, True, True), 2)),
    "gemma4-26b-a4b": dict(n_layers=6, n_expert=16,
                           gemma4=_g4("gemma4-26b-a4b", (True, True, True, True, True, False), 0)),
}


def count(name: str, show: bool = False) -> tuple[int, int]:
    spec = replace(PRESETS[name], n_vocab=8192, weight_type="Q4_K_M", **CASES[name])
    with tempfile.TemporaryDirectory() as d:
        gf = open_gguf(synth.write_gguf(spec, Path(d) / f"{name}.gguf"))
        plan = build_plan(build_spec(gf))
        labels = [x.label for x in GPUBackend(gf, plan, 256, max_seqs=4)._multi_step(1, False).dispatches]
    if show:
        print("\n".join("    " + lb for lb in labels))
    return len(labels), spec.n_layers


if __name__ == "__main__":
    names = sys.argv[1:] or list(CASES)
    for n in names:
        total, layers = count(n, show=len(names) == 1)
        print(f"{n}: {total} dispatches a decode step over {layers} layers (embedding and head included)", flush=True)
