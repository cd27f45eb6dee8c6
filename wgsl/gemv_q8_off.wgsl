// No rounded copy of the GEMV's output (gemv_q8_on.wgsl writes one).

fn q8_keep(j: u32, row: u32, v: f32) {
}

fn q8_rows(tid: u32, block: u32, t0: u32) {
}
