// The IQ4_NL / IQ4_XS code book for gemm_mmq.wgsl's readers (mmq_iq4_nl.wgsl,
// mmq_iq4_xs.wgsl), looked up a byte (two nibbles) at a time: entry b holds
// the int8 values of b's low nibble (byte 0) and high nibble (byte 2), so one
// workgroup load per weight byte gives both values.

const IQ4_VALUES: array<i32, 16> = array<i32, 16>(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

var<workgroup> iq4_pairs: array<u32, 256>;

fn reader_init(tid: u32) {
    for (var b = tid; b < 256u; b += WG) {
        iq4_pairs[b] = (u32(IQ4_VALUES[b & 15u]) & 0xFFu) | ((u32(IQ4_VALUES[b >> 4u]) & 0xFFu) << 16u);
    }
}

// The values of a word's four low nibbles (x) and four high nibbles (y), as int8 lanes.
fn iq4_word(q: u32) -> vec2<u32> {
    let a = iq4_pairs[q & 0xFFu] | (iq4_pairs[(q >> 8u) & 0xFFu] << 8u);
    let b = iq4_pairs[(q >> 16u) & 0xFFu] | (iq4_pairs[q >> 24u] << 8u);
    return vec2<u32>((a & 0xFFFFu) | (b << 16u), (a >> 16u) | (b & 0xFFFF0000u));
}
