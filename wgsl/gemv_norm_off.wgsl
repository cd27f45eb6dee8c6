// The GEMV's activations from binding 2, rounded by the dispatch before it (quantize_q8, rmsnorm_q8,
// ...); gemv_norm_on.wgsl rounds its input norm itself.

@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;

fn norm_in(tid: u32, t0: u32) {
}

// Where token t's rounded row starts in xq, in vec4.
fn x_row(t: u32) -> u32 {
    return x_token(t) * params.x_stride;
}
