// What rmsnorm_add.wgsl and rmsnorm_add_q8.wgsl share: the params, the post-norm residual add's
// bindings, rms_common's sums and the stream's new value, so both write the same floats. The includer
// declares SCALE.

struct Params {
    width: u32,
    group: u32,  // = width (a whole-row norm); rms_common's name
    eps: f32,
    T: u32,
    scale: f32,
    w_width: u32,
    eps2: f32,      // rmsnorm_add_q8's NORM2 (unread by rmsnorm_add)
    q_stride: u32,  // rmsnorm_add_q8's xq words between tokens
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> resid: array<f32>;
@group(0) @binding(5) var<storage, read> w: array<f32>;  // SCALE's weights (a dummy without)

var<workgroup> partial: array<f32, WG>;

// #include rms_common

// Value k of the row's new stream: resid + x / rms(x) * g, then with SCALE (y * scale) * w[k % w_width].
fn stream(base: u32, k: u32, inv: f32) -> f32 {
    var v = resid[base + k] + x[base + k] * inv * g[k];
    if (SCALE) {
        v = (v * params.scale) * w[k % params.w_width];
    }
    return v;
}
