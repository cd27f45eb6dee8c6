// Rotary position embedding, in place on x [T, n_heads * head_dim].
// STYLE norm rotates adjacent pairs (x[2i], x[2i+1]) (llama); neox rotates
// (x[i], x[i + n_rot/2]) (qwen, gemma). Dims >= n_rot are left alone.
// angle_i = pos * freq_scale * theta^(-2i/n_rot) / factor_i, pos = state[0] + t.
// Dispatch (n_heads, T, 1).

struct Params {
    n_heads: u32,
    head_dim: u32,
    n_rot: u32,
    theta: f32,
    freq_scale: f32,
    has_factors: u32,
}

const WG: u32 = 64u;
// STYLE is filled with `norm` or `neox`, which name these constants.
const norm: u32 = 0u;
const neox: u32 = 1u;
const STYLE: u32 = {{STYLE}};
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

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> factors: array<f32>;
@group(0) @binding(3) var<storage, read> state: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let pos = f32(state[0] + wid.y);
    let base = (wid.y * params.n_heads + wid.x) * params.head_dim;
    let half_rot = params.n_rot / 2u;
    let log2_theta = log2(params.theta);
    for (var i = tid; i < half_rot; i += WG) {
        // theta^(-2i/n_rot) = 2^(-2i/n_rot * log2 theta) in f32 (2i/n_rot is exact for
        // power-of-two n_rot); log2's error is scaled by 2i/n_rot, small where inv is large.
        var inv = exp2_accurate(-(f32(2u * i) / f32(params.n_rot)) * log2_theta);
        if (params.has_factors != 0u) {
            inv = inv / factors[i];
        }
        let angle = pos * params.freq_scale * inv;
        // Reduce to [-pi, pi] first: GPU sin/cos are only accurate on that range
        // (Vulkan requires 2^-11 absolute there and nothing outside it).
        let k = round(angle * INV_TWO_PI);
        let r = (angle - k * TWO_PI_HI) - k * TWO_PI_LO;
        let c = cos(r);
        let s = sin(r);
        var ia: u32;
        var ib: u32;
        if (STYLE == neox) {
            ia = base + i;
            ib = base + i + half_rot;
        } else {
            ia = base + 2u * i;
            ib = ia + 1u;
        }
        let a = x[ia];
        let b = x[ib];
        x[ia] = a * c - b * s;
        x[ib] = a * s + b * c;
    }
}
