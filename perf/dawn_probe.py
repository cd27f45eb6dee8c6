"""What Dawn (wgpudawn) offers on this machine, and how fast its tensor-core path multiplies.

Prints the adapters, features, limits and subgroup-matrix configurations (with
the toggle `vulkan_enable_f16_on_nvidia`), then times a plain f16 GEMM built on
`chromium_experimental_subgroup_matrix`: tiles staged in workgroup memory, each
subgroup a grid of result matrices. It checks the product against numpy and
reports TFLOP/s, so a kernel design can be judged before it is written into
the engine.

    source .gpu/setup.sh && python3 perf/dawn_probe.py [--out perf/h200/dawn-probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

KERNEL = """
enable f16;
enable subgroups;
enable chromium_experimental_subgroup_matrix;

const BM = {BM}u;  // weight rows per workgroup
const BN = {BN}u;  // tokens per workgroup
const BK = {BK}u;
const SGM = {SGM}u; // subgroups along rows
const SGN = {SGN}u;
const MM = {M}u; const NN = {N}u; const KK = {K}u;  // one subgroup matrix
const TM = BM / SGM / MM;  // result matrices per subgroup, rows
const TN = BN / SGN / NN;
const THREADS = SGM * SGN * {SG}u;

struct P {{ n_out: u32, t: u32, k: u32, pad: u32 }};
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<vec4<f16>>;   // [n_out][k]
@group(0) @binding(2) var<storage, read> x: array<vec4<f16>>;   // [t][k]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;   // [t][n_out]

var<workgroup> ws: array<f16, BM * BK>;
var<workgroup> xs: array<f16, BN * BK>;

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_id) sg: u32) {{
  let row0 = wid.x * BM;
  let tok0 = wid.y * BN;
  let sm = sg % SGM;
  let sn = sg / SGM;
  var acc: array<array<subgroup_matrix_result<f32, NN, MM>, TN>, TM>;
  let k4 = p.k / 4u;
  for (var k0 = 0u; k0 < p.k; k0 += BK) {{
    for (var i = li; i < BM * BK / 4u; i += THREADS) {{
      let r = i / (BK / 4u); let c = i % (BK / 4u);
      let v = w[(row0 + r) * k4 + k0 / 4u + c];
      ws[r * BK + c * 4u] = v.x; ws[r * BK + c * 4u + 1u] = v.y; ws[r * BK + c * 4u + 2u] = v.z; ws[r * BK + c * 4u + 3u] = v.w;
    }}
    for (var i = li; i < BN * BK / 4u; i += THREADS) {{
      let r = i / (BK / 4u); let c = i % (BK / 4u);
      let v = x[(tok0 + r) * k4 + k0 / 4u + c];
      xs[r * BK + c * 4u] = v.x; xs[r * BK + c * 4u + 1u] = v.y; xs[r * BK + c * 4u + 2u] = v.z; xs[r * BK + c * 4u + 3u] = v.w;
    }}
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk += KK) {{
      var lefts: array<subgroup_matrix_left<f16, KK, MM>, TM>;
      for (var a = 0u; a < TM; a++) {{
        lefts[a] = subgroupMatrixLoad<subgroup_matrix_left<f16, KK, MM>>(&ws, ((sm * TM + a) * MM) * BK + kk, false, BK);
      }}
      for (var b = 0u; b < TN; b++) {{
        let right = subgroupMatrixLoad<subgroup_matrix_right<f16, NN, KK>>(&xs, ((sn * TN + b) * NN) * BK + kk, true, BK);
        for (var a = 0u; a < TM; a++) {{
          acc[a][b] = subgroupMatrixMultiplyAccumulate(lefts[a], right, acc[a][b]);
        }}
      }}
    }}
    workgroupBarrier();
  }}
  for (var a = 0u; a < TM; a++) {{
    for (var b = 0u; b < TN; b++) {{
      let r = row0 + (sm * TM + a) * MM;
      let t = tok0 + (sn * TN + b) * NN;
      subgroupMatrixStore(&y, t * p.n_out + r, acc[a][b], true, p.n_out);
    }}
  }}
}}
"""


# (BM, BN, BK, SGM, SGN): workgroup rows, tokens, K per stage, subgroups along rows and tokens.
TILES = ((64, 64, 32, 2, 2), (64, 64, 64, 2, 2), (64, 64, 32, 2, 1), (64, 64, 32, 1, 2), (32, 64, 32, 1, 2),
         (64, 32, 32, 2, 1), (128, 64, 32, 4, 2), (128, 64, 32, 2, 2), (128, 128, 32, 4, 2), (64, 128, 32, 2, 4),
         (128, 128, 32, 2, 2), (128, 128, 64, 2, 2), (128, 128, 64, 4, 2), (256, 128, 32, 4, 2))


def unrolled(code: str, TM: int, TN: int) -> str:
    """The kernel with its loops over result matrices written out: acc_a_b and left_a are variables."""
    decl = "\n".join(f"  var acc_{a}_{b}: subgroup_matrix_result<f32, NN, MM>;" for a in range(TM) for b in range(TN))
    body = []
    for a in range(TM):
        body.append(f"      let left_{a} = subgroupMatrixLoad<subgroup_matrix_left<f16, KK, MM>>(&ws, ((sm * TM + {a}u) * MM) * BK + kk, false, BK);")
    for b in range(TN):
        body.append(f"      let right_{b} = subgroupMatrixLoad<subgroup_matrix_right<f16, NN, KK>>(&xs, ((sn * TN + {b}u) * NN) * BK + kk, true, BK);")
        for a in range(TM):
            body.append(f"      acc_{a}_{b} = subgroupMatrixMultiplyAccumulate(left_{a}, right_{b}, acc_{a}_{b});")
    store = "\n".join(f"  subgroupMatrixStore(&y, (tok0 + (sn * TN + {b}u) * NN) * p.n_out + row0 + (sm * TM + {a}u) * MM, acc_{a}_{b}, true, p.n_out);"
                       for a in range(TM) for b in range(TN))
    code = code.replace("  var acc: array<array<subgroup_matrix_result<f32, NN, MM>, TN>, TM>;", decl)
    start = code.index("      var lefts")
    end = code.index("    workgroupBarrier();\n  }}", start)
    code = code[:start] + "\n".join(body).replace("{", "{{").replace("}", "}}") + "\n    }}\n" + code[end:]
    start = code.index("  for (var a = 0u; a < TM; a++) {{\n    for (var b")
    code = code[:start] + store.replace("{", "{{").replace("}", "}}") + "\n}}\n"
    return code


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--shape", default="4096,4096,512", help="n_out,k,t")
    ap.add_argument("--unrolled", action="store_true", help="every result matrix a variable of its own")
    ap.add_argument("--first-config", action="store_true", help="time only the first f16 -> f32 configuration")
    a = ap.parse_args()
    import wgpudawn as wgpu
    from wgpudawn.backends.dawn import extras

    extras.set_instance_extras(enable_toggles=["allow_unsafe_apis", "vulkan_enable_f16_on_nvidia",
                                               "disable_robustness"])
    report: dict = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d")}
    adapters = wgpu.gpu.enumerate_adapters_sync()
    report["adapters"] = [dict(x.info) for x in adapters]
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    report["adapter"] = dict(adapter.info)
    report["features"] = sorted(adapter.features)
    report["limits"] = dict(adapter.limits)
    props = extras.get_adapter_properties(adapter)
    configs = props.get("subgroup_matrix_configs", [])
    report["subgroup_matrix_configs"] = configs
    print(json.dumps({k: report[k] for k in ("adapter", "subgroup_matrix_configs")}, indent=1, default=str))
    wanted = [f for f in ("subgroups", "shader-f16", "chromium-experimental-subgroup-matrix", "timestamp-query")
              if f in adapter.features]
    dev = adapter.request_device_sync(required_features=wanted,
                                      required_limits={k: adapter.limits[k] for k in (
                                          "max-storage-buffer-binding-size", "max-buffer-size",
                                          "max-compute-workgroup-storage-size",
                                          "max-compute-invocations-per-workgroup", "max-compute-workgroup-size-x")})
    f16 = [c for c in configs if str(c.get("component_type")) == "f16" and str(c.get("result_component_type")) == "f32"]
    f16 = f16[:1] if a.first_config else f16
    report["runs"] = []
    if not f16:
        print("no f16 -> f32 subgroup matrix config")
    n_out, K, T = map(int, a.shape.split(","))
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n_out, K)) * 0.05).astype(np.float16)
    x = rng.standard_normal((T, K)).astype(np.float16)
    ref = x.astype(np.float32) @ w.astype(np.float32).T
    U = wgpu.BufferUsage
    bw = dev.create_buffer_with_data(data=w.tobytes(), usage=U.STORAGE)
    bx = dev.create_buffer_with_data(data=x.tobytes(), usage=U.STORAGE)
    by = dev.create_buffer(size=T * n_out * 4, usage=U.STORAGE | U.COPY_SRC)
    bp = dev.create_buffer_with_data(data=np.array([n_out, T, K, 0], np.uint32).tobytes(), usage=U.UNIFORM)
    for c in f16:
        M, N, Kc = int(c["m"]), int(c["n"]), int(c["k"])
        sgsize = int(c.get("max_subgroup_size") or 32)
        for BM, BN, BK, SGM, SGN in TILES:
            if BM % (SGM * M) or BN % (SGN * N) or BK % Kc or (BM + BN) * BK * 2 > adapter.limits[
                    "max-compute-workgroup-storage-size"]:
                continue
            run = {"config": c, "tile": [BM, BN, BK, SGM, SGN], "unrolled": a.unrolled}
            try:
                TM, TN = BM // SGM // M, BN // SGN // N
                src = unrolled(KERNEL, TM, TN) if a.unrolled else KERNEL
                code = src.format(BM=BM, BN=BN, BK=BK, SGM=SGM, SGN=SGN, M=M, N=N, K=Kc, SG=sgsize)
                mod = dev.create_shader_module(code=code)
                pipe = dev.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
                bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                    {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                    for i, b in enumerate((bp, bw, bx, by))])

                def go(reps):
                    enc = dev.create_command_encoder()
                    cp = enc.begin_compute_pass()
                    cp.set_pipeline(pipe)
                    cp.set_bind_group(0, bg)
                    for _ in range(reps):
                        cp.dispatch_workgroups(n_out // BM, T // BN, 1)
                    cp.end()
                    dev.queue.submit([enc.finish()])
                    dev.queue.read_buffer(by, 0, 16)

                go(1)
                got = np.frombuffer(dev.queue.read_buffer(by), np.float32).reshape(T, n_out)
                run["max_err"] = float(np.abs(got - ref).max())
                run["ref_max"] = float(np.abs(ref).max())
                go(3)
                t0 = time.perf_counter()
                go(20)
                dt = (time.perf_counter() - t0) / 20
                run["ms"] = dt * 1e3
                run["tflops"] = 2 * n_out * K * T / dt / 1e12
            except Exception as e:  # a config the compiler or driver refuses
                run["error"] = str(e)[:400]
            print(json.dumps(run, default=str))
            report["runs"].append(run)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
