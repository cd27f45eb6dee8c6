// gemm_mma.wgsl and mma_dequant.wgsl for readers without a direct conversion (mma_direct_TYPE.wgsl):
// their tiles stage int8 lanes and scales (mma_stage.wgsl), so this is never called.

fn unit_f16(g: Raw, rb: u32, k0: u32, u: u32, rho: u32) {}
