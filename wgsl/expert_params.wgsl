// The uniform of an expert bank's binding (expert_on.wgsl, mmq_expert_on.wgsl; kernels_moe
// writes it): experts e0 .. e0 + count held, `stride` bytes apart from `base` (slot 1, a pair's
// up rows: base2 / stride2), and x_div pairs sharing one input row.

struct Experts {
    e0: u32,
    count: u32,
    stride: u32,
    stride2: u32,
    base: u32,
    base2: u32,
    x_div: u32,
    _pad: u32,
}

@group(0) @binding(8) var<uniform> experts: Experts;
