// Q8_0 for gemm_mmq.wgsl: 32 values, 34 bytes (blocks 2-byte aligned) = f16 d,
// 32 int8 q; v = d q. A staging unit is one block (units per stage: SUB): its
// 32 bytes of q from the three aligned vec4 holding them (realign, as the
// GEMV's reader), and the word holding d: four loads where words took nine.
// #include realign

const UNITS: u32 = SUB;
const MIN_TERM: bool = false;
const SCALE16: bool = false;
const INIT: bool = false;

struct Raw {
    v: array<vec4<u32>, 3>,  // the aligned vec4 holding q
    d: u32,                  // the word holding d
}

fn reader_init(tid: u32) {}

fn fetch_unit(slot: u32, rb: u32, k0: u32, u: u32) -> Raw {
    let b = rb + (k0 / 32u + u) * 34u;
    let i = (b + 2u) >> 4u;
    return Raw(array<vec4<u32>, 3>(wvec(slot, i), wvec(slot, i + 1u), wvec(slot, i + 2u)), wword(slot, b >> 2u));
}

fn put_unit(g: Raw, rb: u32, k0: u32, u: u32, rho: u32, buf: u32) {
    let b = rb + (k0 / 32u + u) * 34u;
    let s = (b + 2u) & 15u;
    put_q(buf, rho, qv(u, 0u), realign(g.v[0], g.v[1], s));
    put_q(buf, rho, qv(u, 1u), realign(g.v[1], g.v[2], s));
    put_s(buf, rho, u, vec2<f32>(half_at(g.d, (b & 2u) != 0u), 0.0));
}
