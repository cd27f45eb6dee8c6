// A post-norm residual add (gemma's post-attention and post-FFN norms): y = resid + x / rms(x) * g,
// then (SCALE, gemma4's layer_output_scale) y = (y * scale) * w[i % w_width]: the plan's RMSNorm,
// Add (and Mul) in one dispatch, with rmsnorm.wgsl's sums (rms_common), so the same floats.
// One workgroup a row: dispatch (1, T, 1).

const SCALE: bool = {{SCALE}};

// #include rmsnorm_add_common

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    if (wid.y >= params.T) {
        return;
    }
    let base = wid.y * params.width;
    let inv = row_inv(base, tid);
    for (var k = tid; k < params.width; k += WG) {
        y[base + k] = stream(base, k, inv);
    }
}
