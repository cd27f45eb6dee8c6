// gemm_mma.wgsl without WVEC: the calls it never makes, for tiles that convert or matrix-copy their weights.

const NWA: u32 = 1u;

fn wvec_fetch(k0: u32, tid: u32, first: u32) -> array<vec4<u32>, NWA> {
    return array<vec4<u32>, NWA>();
}

fn wvec_put(w: array<vec4<u32>, NWA>, tid: u32) {}
