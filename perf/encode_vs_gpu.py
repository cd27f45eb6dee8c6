"""Host encode time against GPU time of decode steps (T=1), per synth model (PRESET or PRESET@dawn):
whether decode is bound by the host recording dispatches or by the GPU running them.

    source .gpu/setup.sh && python3 perf/encode_vs_gpu.py qwen35-4b qwen35-4b@dawn llama-3.1-8b
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infr import bench
from infr.gguf_file import open_gguf
from infr.models import build_spec
from infr.plan import build_plan
from infr.gpu.backend import GPUBackend
from infr.gpu.device import get_device

for ref in sys.argv[1:]:
    be_name = "gpu"
    if "@" in ref:
        ref, be_name = ref.split("@")
    path = bench.model_path("synth:" + ref)
    gf = open_gguf(path)
    plan = build_plan(build_spec(gf))
    dev = get_device(flavor="dawn") if be_name == "dawn" else None
    be = GPUBackend(gf, plan, 1024, dev=dev) if dev else GPUBackend(gf, plan, 1024)
    be.forward(list(range(1, 9)), 0)
    rec = be._multi_step(1, False)
    d = be.dev.device
    # host: encode 64 steps into one pass
    for rep in range(2):
        t0 = time.perf_counter()
        enc = d.create_command_encoder(); cp = enc.begin_compute_pass(); rec.encode(cp, times=64); cp.end(); cmd = enc.finish()
        t1 = time.perf_counter()
        d.queue.submit([cmd]); d.queue.read_buffer(be.token_log, 0, 4)
        t2 = time.perf_counter()
    # gpu only: the same command buffer twice? encode ahead, then time submits back to back
    cmds = []
    for _ in range(4):
        enc = d.create_command_encoder(); cp = enc.begin_compute_pass(); rec.encode(cp, times=64); cp.end(); cmds.append(enc.finish())
    t3 = time.perf_counter(); d.queue.submit(cmds); d.queue.read_buffer(be.token_log, 0, 4); t4 = time.perf_counter()
    print(f"{ref}@{be_name}: {len(rec)} dispatches/step; encode {1e6*(t1-t0)/64:.0f} us/step; "
          f"gpu (pre-encoded, 256 steps) {1e6*(t4-t3)/256:.0f} us/step", flush=True)
