// gemm_mma.wgsl's XVEC (tile field XC 2): the token tile's words come from q8_f16.wgsl's f16 rows
// (binding 12 as vec4 words of 8 values, T rounded up to BT rows), copied as the weights' are
// (WVEC): no q8 lane is turned into f16 in every workgroup of a token column.

@group(0) @binding(12) var<storage, read> x16v: array<vec4<u32>>;

// Word i (of BT * KS / 8, [token][8 values]) of the stage at value k0.
fn x_word(i: u32, k0: u32, tok0: u32) -> vec4<u32> {
    return x16v[((tok0 + i / (KS / 8u)) * params.K + k0) / 8u + i % (KS / 8u)];
}
