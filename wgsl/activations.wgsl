// Activations shared by the elementwise kernels and the fused gate||up GEMV.

const GELU_C: f32 = 0.7978845608028654;  // sqrt(2 / pi)

// tanh saturates to +-1 in f32 beyond |x| = 9; clamping keeps drivers whose
// tanh is (e^2x - 1) / (e^2x + 1) away from inf / inf.
fn tanh_safe(x: f32) -> f32 {
    return tanh(clamp(x, -9.0, 9.0));
}

fn silu(g: f32) -> f32 {
    // exp(-g) overflows to inf for g < -88: g / inf = -0, the right limit.
    return g / (1.0 + exp(-g));
}

// tanh approximation, as gemma and llama.cpp use.
fn gelu(g: f32) -> f32 {
    return 0.5 * g * (1.0 + tanh_safe(GELU_C * (g + 0.044715 * g * g * g)));
}
