// gemma4's MoE block end in one dispatch (fusion.py's moe_post_norms): the experts' sum (moe_combine.wgsl's
// combine: each pair's row times its expert's scale, then its router weight, added in selection order),
// its post-norm, the dense FFN's post-norm of f, and their sum:
//   dst[t] = f[t] / rms(f[t]) * gf + m / rms(m) * gm,  m = the combined row,
// where the unfused graph runs the combine, rmsnorm(f), then rmsnorm_add. Workgroup j of a token writes
// values [1024 j, 1024 j + 1024); each sums both whole rows' squares itself (rmsnorm_q8.wgsl's order: 4
// consecutive values an invocation, strided by the workgroup, then a tree), the combine included.
// dispatch (ceil(D / 1024), T, 1); dst is not f.

struct Params {
    D: u32,         // values per row
    K: u32,         // n_used
    T: u32,
    weighted: u32,  // multiply by wts (the weight after the expert)
    scaled: u32,    // each pair's row times its expert's scale first
    eps_m: f32,
    eps_f: f32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;  // [T * K][D]: each pair's expert output
@group(0) @binding(2) var<storage, read> wts: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<storage, read> f: array<f32>;
@group(0) @binding(5) var<storage, read> scales: array<f32>;  // [n_expert] (a dummy unless scaled)
@group(0) @binding(6) var<storage, read> ids: array<u32>;
@group(0) @binding(7) var<storage, read> gm: array<f32>;
@group(0) @binding(8) var<storage, read> gf: array<f32>;

var<workgroup> part_m: array<f32, WG>;
var<workgroup> part_f: array<f32, WG>;

// #include moe_pair_sum

fn combined4(t: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(pair_sum(t, i), pair_sum(t, i + 1u), pair_sum(t, i + 2u), pair_sum(t, i + 3u));
}

fn f4(base: u32, i: u32) -> vec4<f32> {
    return vec4<f32>(f[base + i], f[base + i + 1u], f[base + i + 2u], f[base + i + 3u]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let t = wid.y;
    if (t >= params.T) {
        return;
    }
    let base = t * params.D;
    var sm = vec4<f32>(0.0);
    var sf = vec4<f32>(0.0);
    for (var w = tid; 4u * w < params.D; w += WG) {
        let m = combined4(t, 4u * w);
        let x = f4(base, 4u * w);
        sm += m * m;
        sf += x * x;
    }
    part_m[tid] = (sm.x + sm.y) + (sm.z + sm.w);
    part_f[tid] = (sf.x + sf.y) + (sf.z + sf.w);
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (tid < stride) {
            part_m[tid] += part_m[tid + stride];
            part_f[tid] += part_f[tid + stride];
        }
        workgroupBarrier();
    }
    let inv_m = 1.0 / sqrt(part_m[0] / f32(params.D) + params.eps_m);
    let inv_f = 1.0 / sqrt(part_f[0] / f32(params.D) + params.eps_f);
    let i = 4u * (wid.x * WG + tid);
    if (i < params.D) {
        let m = combined4(t, i) * inv_m * vec4<f32>(gm[i], gm[i + 1u], gm[i + 2u], gm[i + 3u]);
        let o = f4(base, i) * inv_f * vec4<f32>(gf[i], gf[i + 1u], gf[i + 2u], gf[i + 3u]) + m;
        dst[base + i] = o.x;
        dst[base + i + 1u] = o.y;
        dst[base + i + 2u] = o.z;
        dst[base + i + 3u] = o.w;
    }
}
