// Rotation angle helpers shared by rope.wgsl and rope_kv.wgsl (one formula, so
// the fused RoPE + KV store rotates exactly like the standalone rope).

// 2*pi split for Cody-Waite reduction: TWO_PI_HI = 201/32 has 8 significant
// bits, so k * TWO_PI_HI is exact for any k below 2^16 turns (positions far past
// 32k), and the subtraction from the nearby angle is exact too.
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.001935307179586232;
const INV_TWO_PI: f32 = 0.15915494309189535;
// Taylor coefficients of 2^f = e^(f ln 2) up to f^7: on |f| <= 1/2 the truncation
// error is ~5e-9, below f32 rounding.
const EXP2_C0: f32 = 1.0;
const EXP2_C1: f32 = 0.6931471805599453;
const EXP2_C2: f32 = 0.2402265069591007;
const EXP2_C3: f32 = 0.055504108664821576;
const EXP2_C4: f32 = 0.009618129107628477;
const EXP2_C5: f32 = 0.0013333558146428441;
const EXP2_C6: f32 = 0.00015403530393381606;
const EXP2_C7: f32 = 1.5252733804059838e-05;

// 2^x to about an ulp on every driver. Vulkan lets hardware exp2 be off by
// 3 + 2|x| ulps (lavapipe's measured ~1.5), and each ulp of an inverse frequency
// near 1 costs 6e-8 * pos radians of angle.
fn exp2_accurate(x: f32) -> f32 {
    let n = round(x);
    let f = x - n;  // exact, |f| <= 1/2
    var p = EXP2_C7;
    p = p * f + EXP2_C6;
    p = p * f + EXP2_C5;
    p = p * f + EXP2_C4;
    p = p * f + EXP2_C3;
    p = p * f + EXP2_C2;
    p = p * f + EXP2_C1;
    p = p * f + EXP2_C0;
    return ldexp(p, i32(n));
}

// (cos, sin) of pair i's angle at position pos: angle_i = pos * freq_scale *
// theta^(-2i/n_rot) / factor (factor 1 without rope factors).
fn rope_cos_sin(pos: f32, i: u32, n_rot: u32, theta: f32, freq_scale: f32, factor: f32) -> vec2<f32> {
    // theta^(-2i/n_rot) = 2^(-2i/n_rot * log2 theta) in f32 (2i/n_rot is exact for
    // power-of-two n_rot); log2's error is scaled by 2i/n_rot, small where inv is large.
    let inv = exp2_accurate(-(f32(2u * i) / f32(n_rot)) * log2(theta)) / factor;
    let angle = pos * freq_scale * inv;
    // Reduce to [-pi, pi] first: GPU sin/cos are only accurate on that range
    // (Vulkan requires 2^-11 absolute there and nothing outside it).
    let k = round(angle * INV_TWO_PI);
    let r = (angle - k * TWO_PI_HI) - k * TWO_PI_LO;
    return vec2<f32>(cos(r), sin(r));
}
