            // llama.cpp's rounding (q8_head_llamacpp)
            let d = q8_scale(m);
            let inv = q8_inverse(m);
            xa = round(xa * inv) * d;
            xb = round(xb * inv) * d;