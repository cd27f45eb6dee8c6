// gemm_mma.wgsl without XVEC: the call it never makes, for tiles that convert or matrix-copy their tokens.

fn x_word(i: u32, k0: u32, tok0: u32) -> vec4<u32> {
    return vec4<u32>();
}
