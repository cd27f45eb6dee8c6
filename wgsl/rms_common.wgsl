// The RMS of values x[base .. base + params.group): 1 / sqrt(mean(x^2) + eps), as rmsnorm.wgsl
// computes it (shared with rmsnorm_add.wgsl, so a fused norm gives the same floats). Needs x,
// params.group, params.eps, a workgroup array `partial` of WG floats and WG a power of two.
// Uniform control flow (barriers).

// #include rms_tree

fn row_inv(base: u32, tid: u32) -> f32 {
    // Four independent loads per step: a plain strided loop waits on each load in turn.
    var s4 = vec4<f32>(0.0);
    var i = tid;
    for (; i + 3u * WG < params.group; i += 4u * WG) {
        let v = vec4<f32>(x[base + i], x[base + i + WG], x[base + i + 2u * WG], x[base + i + 3u * WG]);
        s4 += v * v;
    }
    for (; i < params.group; i += WG) {
        let v = x[base + i];
        s4.x += v * v;
    }
    return rms_tree((s4.x + s4.y) + (s4.z + s4.w), tid, params.group, params.eps);
}
