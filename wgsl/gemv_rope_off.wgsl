// No rope epilogue (gemv_rope_on.wgsl has one).

fn rope_rows(tid: u32, block: u32, t0: u32) {
}
