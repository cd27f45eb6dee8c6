// Grammar masks of a step's constrained output rows the GPU draws (infr/gpu/kernels_mask.py): the
// logits of the tokens a row's bitmask does not allow become -inf, before the step's argmax,
// as infr.sampling.host_sample masks them on the host. `masks` holds, for masked row j, its
// row of the logits buffer at [j], and its mask at head + j * words: bit i % 32 of word i / 32
// allows token i (llguidance's byte bitmask read as little-endian u32 words; the packer zeroes
// the bits past n). Dispatch (ceil(n / WG), rows, 1): one invocation per token of masked row
// workgroup_id.y; only the disallowed tokens are written.

struct Params {
    n: u32,        // vocabulary: the logits row stride
    words: u32,    // u32 words of one row's mask: ceil(n / 32)
    head: u32,     // words before the first mask (the row indices)
    neg_inf: u32,  // the bits of -inf, a runtime value: an infinite constant does not compile
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> masks: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let i = wid.x * WG + tid;
    if (i >= params.n) {
        return;
    }
    let bits = masks[params.head + wid.y * params.words + i / 32u];
    if (((bits >> (i % 32u)) & 1u) == 0u) {
        logits[masks[wid.y] * params.n + i] = bitcast<f32>(params.neg_inf);
    }
}
