// No rounded copy of the attention output (attn_q8_on.wgsl writes one).

fn q8_out(vals: vec4<f32>, v: u32, tid: u32, live: bool, t: u32) {
}
