// gemm_mma.wgsl without WVEC: the call it never makes, for tiles that convert or matrix-copy their weights.

fn w_word(i: u32, k0: u32, first: u32) -> vec4<u32> {
    return vec4<u32>();
}
