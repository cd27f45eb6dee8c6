// rope_kv.wgsl's params (kernels_attention.pack_rope_kv), also the rotating q|k|v GEMV's
// (gemv_rope_on.wgsl, which has no norms: eps unused there).

struct RopeKvParams {
    n_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    v_head_dim: u32,
    n_rot: u32,
    theta: f32,
    freq_scale: f32,
    has_factors: u32,
    blocks_per_seq: u32,
    eps: f32,  // the norms' (NQ, NK, NV)
}
