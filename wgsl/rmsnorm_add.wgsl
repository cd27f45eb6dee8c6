// A post-norm residual add (gemma's post-attention and post-FFN norms): y = resid + x / rms(x) * g,
// then (SCALE, gemma4's layer_output_scale) y = (y * scale) * w[i % w_width]: the plan's RMSNorm,
// Add (and Mul) in one dispatch, with rmsnorm.wgsl's sums (rms_common), so the same floats.
// One workgroup a row: dispatch (1, T, 1).

struct Params {
    width: u32,
    group: u32,  // = width (a whole-row norm); rms_common's name
    eps: f32,
    T: u32,
    scale: f32,
    w_width: u32,
}

const WG: u32 = 256u;
const SCALE: bool = {{SCALE}};

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> resid: array<f32>;
@group(0) @binding(5) var<storage, read> w: array<f32>;  // SCALE's weights (a dummy without)

var<workgroup> partial: array<f32, WG>;

// #include rms_common

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let base = wid.y * params.width;
    let inv = row_inv(base, tid);
    for (var k = tid; k < params.width; k += WG) {
        var v = resid[base + k] + x[base + k] * inv * g[k];
        if (SCALE) {
            v = (v * params.scale) * w[k % params.w_width];
        }
        y[base + k] = v;
    }
}
