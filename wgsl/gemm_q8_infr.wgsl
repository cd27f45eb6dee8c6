            let d = m / 127.0;
            if (d > 0.0) {
                xa = round(xa / d) * d;
                xb = round(xb / d) * d;
            }