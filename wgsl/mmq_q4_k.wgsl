// Q4_K for gemm_mmq.wgsl: 256 values, 144 bytes (16-byte aligned) = f16 d,
// f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles. Nibble
// vec4 2c + h holds values [16h, 16h + 16) of sub-blocks 2c (low nibbles) and
// 2c + 1 (high); v = d sc q - dmin m. A staging unit is one such vec4 (units
// per stage: SUB); unit h = 0 / 1 also writes sub-block 2c's / 2c + 1's scale.
// #include mmq_q4_k_scales

const UNITS: u32 = SUB;
const MIN_TERM: bool = true;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    q: vec4<u32>,   // the unit's nibbles
    hd: vec4<u32>,  // the block's d, dmin and scales
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let bv = (rb + (k0 / 256u) * 144u) / 16u;
    let c = (k0 % 256u) / 64u + u / 2u;
    return Raw(wvec(slot, bv + 1u + 2u * c + u % 2u), wvec(slot, bv));
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let cl = u / 2u;
    let hf = u % 2u;
    put_q(buf, rho, qv(2u * cl, hf), g.q & vec4<u32>(LO4));
    put_q(buf, rho, qv(2u * cl + 1u, hf), (g.q >> vec4<u32>(4u)) & vec4<u32>(LO4));
    let dm = unpack2x16float(g.hd.x);
    let sm = k_scale_min(g.hd, (k0 % 256u) / 32u + 2u * cl + hf);
    put_s(buf, rho, 2u * cl + hf, vec2<f32>(dm.x * sm.x, -dm.y * sm.y));
}
