// Dense weights (gemv.wgsl, matmul.wgsl without an expert bank): token t reads x row t, its
// rows start at byte 0 of the binding, and no workgroup is skipped.

fn expert_skip(a: u32) -> bool {
    return false;
}

fn expert_byte(slot: u32, a: u32) -> u32 {
    return 0u;
}

fn x_token(a: u32) -> u32 {
    return a;
}
