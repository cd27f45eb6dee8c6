// No twin norm (rmsnorm_twin_on.wgsl writes one).

fn twin_store(base: u32, i: u32, v: vec4<f32>, inv: f32) {
}
