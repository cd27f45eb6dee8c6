// rmsnorm_add.wgsl's post-norm residual add whose new stream row also goes out rounded for the int8
// GEMV that reads it next (q8_common.wgsl): with NORM2, the next RMSNorm of that row (rmsnorm_q8.wgsl's:
// gemma's pre-FFN norm after its post-attention norm, the next layer's input norm after the post-FFN
// or per-layer-input one) written to z and rounded; without, the stream row itself rounded (gemma4's
// per-layer input gate reads it). One dispatch where decode ran two (a dispatch costs about as much as
// these norms' work). Workgroup j of a row writes values [1024 j, 1024 j + 1024) as rmsnorm_q8's do,
// each computing the row's first norm and (NORM2) the new row's squares itself, in rmsnorm_add's and
// rmsnorm_q8's orders: the same floats as those kernels one after another. y never aliases resid
// (the lowering's buffer pair). width % 256 == 0. Dispatch (ceil(width / 1024), T, 1).

const SCALE: bool = {{SCALE}};
const NORM2: bool = {{NORM2}};

// #include rmsnorm_add_common

@group(0) @binding(6) var<storage, read> g2: array<f32>;  // NORM2's weights (a dummy without)
@group(0) @binding(7) var<storage, read_write> z: array<f32>;  // NORM2's output (a scratch of its own without)
@group(0) @binding(8) var<storage, read_write> xq: array<u32>;

// #include q8_common

fn stream4(base: u32, k: u32, inv: f32) -> vec4<f32> {
    return vec4<f32>(stream(base, k, inv), stream(base, k + 1u, inv), stream(base, k + 2u, inv), stream(base, k + 3u, inv));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let base = wid.y * params.width;
    let inv = row_inv(base, tid);
    var inv2 = 0.0;
    if (NORM2) {
        // rmsnorm_q8's sum: invocation tid owns words tid, tid + 256, ... of 4 values.
        var s4 = vec4<f32>(0.0);
        for (var k = tid; 4u * k < params.width; k += WG) {
            let v = stream4(base, 4u * k, inv);
            s4 += v * v;
        }
        inv2 = rms_tree((s4.x + s4.y) + (s4.z + s4.w), tid, params.width, params.eps2);  // after row_inv's reads
    }
    let i = 4u * (wid.x * WG + tid);  // this invocation's 4 values
    let live = i < params.width;
    var o = vec4<f32>(0.0);
    if (live) {
        let v = stream4(base, i, inv);
        y[base + i] = v.x;
        y[base + i + 1u] = v.y;
        y[base + i + 2u] = v.z;
        y[base + i + 3u] = v.w;
        o = v;
        if (NORM2) {
            o = v * inv2 * vec4<f32>(g2[i], g2[i + 1u], g2[i + 2u], g2[i + 3u]);
            z[base + i] = o.x;
            z[base + i + 1u] = o.y;
            z[base + i + 2u] = o.z;
            z[base + i + 3u] = o.w;
        }
    }
    q8_store(o, i, tid, live, wid.y * params.q_stride, params.width);
}
