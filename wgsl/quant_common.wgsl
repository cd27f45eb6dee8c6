// Byte-level readers over a weight tensor bound as `w: array<u32>` (the raw
// GGUF bytes, little-endian), and small vector helpers for the block readers.
// GGUF blocks are packed back to back, so a block (and the halves and words in
// it) often starts at a byte offset that is not a multiple of 4: every reader
// takes a byte offset. All GGUF block sizes are even, so halves inside blocks
// sit at even offsets and never straddle two words.
// Expects module-scope `w: array<u32>` and `x: array<f32>` from the kernel.

fn rd_u8(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 3u) * 8u)) & 0xFFu;
}

// A 16-bit value at an even byte offset.
fn rd_u16(b: u32) -> u32 {
    return (w[b >> 2u] >> ((b & 2u) * 8u)) & 0xFFFFu;
}

// An f16 at an even byte offset, widened to f32.
fn rd_f16(b: u32) -> f32 {
    return unpack2x16float(rd_u16(b)).x;
}

// 32 bits starting at any byte offset (two words when unaligned). The aligned
// case is separate because WGSL masks shift amounts: `hi << 32` would be `hi`.
fn rd_u32(b: u32) -> u32 {
    let i = b >> 2u;
    let sh = (b & 3u) * 8u;
    if (sh == 0u) {
        return w[i];
    }
    return (w[i] >> sh) | (w[i + 1u] << (32u - sh));
}

// The four bytes of a word as unsigned values, lowest byte first.
fn u8x4(q: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu));
}

// The four bytes of a word as int8, lowest byte first.
fn i8x4(q: u32) -> vec4<f32> {
    let s = bitcast<vec4<i32>>(vec4<u32>(q) << vec4<u32>(24u, 16u, 8u, 0u));
    return vec4<f32>(s >> vec4<u32>(24u));
}

// Field `(byte >> shift) & mask` of each of the four bytes of a word: nibbles
// (shift 0 / 4, mask 0xF), 2-bit quants (shift 0..6, mask 3), single bits.
fn bits4(q: u32, shift: u32, mask: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(q) >> (vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(shift))) & vec4<u32>(mask));
}

fn lo4(q: u32) -> vec4<f32> {
    return bits4(q, 0u, 0xFu);
}

fn hi4(q: u32) -> vec4<f32> {
    return bits4(q, 4u, 0xFu);
}

fn rd_i8(b: u32) -> f32 {
    return f32(bitcast<i32>(rd_u8(b) << 24u) >> 24u);
}

fn sum4(v: vec4<f32>) -> f32 {
    return v.x + v.y + v.z + v.w;
}

// Activations x[o .. o+4).
fn x4(o: u32) -> vec4<f32> {
    return vec4<f32>(x[o], x[o + 1u], x[o + 2u], x[o + 3u]);
}

// Q4_K / Q5_K pack eight 6-bit scales and eight 6-bit mins into 12 bytes at
// `sb`: scales 0..3 and mins 0..3 are the low 6 bits of bytes 0..3 and 4..7;
// scales and mins 4..7 take their low 4 bits from the low / high nibbles of
// bytes 8..11 and their top 2 bits from the top 2 bits of bytes 0..3 / 4..7.
struct KScales {
    sc_lo: vec4<f32>,
    sc_hi: vec4<f32>,
    m_lo: vec4<f32>,
    m_hi: vec4<f32>,
}

fn k_scales(sb: u32) -> KScales {
    let s0 = rd_u32(sb);
    let s1 = rd_u32(sb + 4u);
    let s2 = rd_u32(sb + 8u);
    return KScales(
        u8x4(s0 & 0x3F3F3F3Fu),
        u8x4((s2 & 0x0F0F0F0Fu) | ((s0 >> 2u) & 0x30303030u)),
        u8x4(s1 & 0x3F3F3F3Fu),
        u8x4(((s2 >> 4u) & 0x0F0F0F0Fu) | ((s1 >> 2u) & 0x30303030u)),
    );
}

fn k_scale(ks: KScales, s: u32) -> f32 {
    return select(ks.sc_lo[s & 3u], ks.sc_hi[s & 3u], s >= 4u);
}

fn k_min(ks: KScales, s: u32) -> f32 {
    return select(ks.m_lo[s & 3u], ks.m_hi[s & 3u], s >= 4u);
}

// The IQ4_NL / IQ4_XS non-linear 4-bit code book (ggml's kvalues_iq4nl).
const IQ4_TABLE: array<f32, 16> = array<f32, 16>(
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
    1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
);

// Table values of the nibbles at `shift` (0 low, 4 high) of a word's four bytes.
fn iq4_lookup(q: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>(
        IQ4_TABLE[(q >> shift) & 0xFu],
        IQ4_TABLE[(q >> (8u + shift)) & 0xFu],
        IQ4_TABLE[(q >> (16u + shift)) & 0xFu],
        IQ4_TABLE[(q >> (24u + shift)) & 0xFu],
    );
}
