// Q5_K for gemm_mmq.wgsl: 256 values, 176 bytes (16-byte aligned) = f16 d, f16
// dmin, 12 bytes of 6-bit scales and mins (as Q4_K's), 32 bytes qh, 128 bytes
// of nibbles laid out as Q4_K's; bit s of qh[l] is the fifth bit of value
// 32s + l; v = d sc q - dmin m. Units as mmq_q4_k.wgsl's, with the 16 qh bytes
// of the unit's half.
// #include mmq_q4_k_scales

const UNITS: u32 = SUB;
const MIN_TERM: bool = true;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    q: vec4<u32>,   // the unit's nibbles
    h: vec4<u32>,   // qh bytes [16h, 16h + 16)
    hd: vec4<u32>,  // the block's d, dmin and scales
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let bv = (rb + (k0 / 256u) * 176u) / 16u;
    let c = (k0 % 256u) / 64u + u / 2u;
    return Raw(wvec(slot, bv + 3u + 2u * c + u % 2u), wvec(slot, bv + 1u + u % 2u), wvec(slot, bv));
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let cl = u / 2u;
    let hf = u % 2u;
    let s = (k0 % 256u) / 32u + 2u * cl;  // sub-block of the low nibbles (in the block)
    let b5 = vec4<u32>(0x01010101u);
    put_q(buf, rho, qv(2u * cl, hf), (g.q & vec4<u32>(LO4)) | (((g.h >> vec4<u32>(s)) & b5) << vec4<u32>(4u)));
    put_q(buf, rho, qv(2u * cl + 1u, hf),
          ((g.q >> vec4<u32>(4u)) & vec4<u32>(LO4)) | (((g.h >> vec4<u32>(s + 1u)) & b5) << vec4<u32>(4u)));
    let dm = unpack2x16float(g.hd.x);
    let sm = k_scale_min(g.hd, s + hf);
    put_s(buf, rho, 2u * cl + hf, vec2<f32>(dm.x * sm.x, -dm.y * sm.y));
}
