
#define LANES 16

/* sinkhorn() on nb <= LANES rows at once, row l of the block in lane l of every temporary:
   each lane performs exactly the scalar sequence below, so the loops over lanes vectorise
   across rows without changing any row's arithmetic (n <= 8). */
static void sinkhorn_block(float *c, long nb, int n, int rounds, float eps) {
    float t[64][LANES], acc[LANES], s[8][LANES];
    int nn = n * n;
    for (int e = 0; e < nn; ++e)
        for (int l = 0; l < LANES; ++l) t[e][l] = l < nb ? c[l * nn + e] : 1.0f;
    for (int it = 0; it <= rounds; ++it) {
        if (it > 0) {
            for (int i = 0; i < n; ++i) {
                for (int l = 0; l < LANES; ++l) acc[l] = 0.0f;
                for (int j = 0; j < n; ++j)
                    for (int l = 0; l < LANES; ++l) acc[l] += t[i * n + j][l];
                for (int l = 0; l < LANES; ++l) acc[l] += eps;
                for (int j = 0; j < n; ++j)
                    for (int l = 0; l < LANES; ++l) t[i * n + j][l] /= acc[l];
            }
        }
        for (int j = 0; j < n; ++j) {
            for (int l = 0; l < LANES; ++l) acc[l] = 0.0f;
            for (int i = 0; i < n; ++i)
                for (int l = 0; l < LANES; ++l) acc[l] += t[i * n + j][l];
            for (int l = 0; l < LANES; ++l) s[j][l] = acc[l] + eps;
        }
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < n; ++j)
                for (int l = 0; l < LANES; ++l) t[i * n + j][l] /= s[j][l];
    }
    for (int e = 0; e < nn; ++e)
        for (int l = 0; l < nb; ++l) c[l * nn + e] = t[e][l];
}

/* comb [rows, n, n] in place: one column normalisation, then rounds x (rows, columns):
   m /= (sum over the normalised dim + eps), sums in index order. */
void sinkhorn(float *c, long rows, int n, int rounds, float eps) {
    if (n <= 8) {
        for (long r = 0; r < rows; r += LANES)
            sinkhorn_block(c + r * n * n, rows - r < LANES ? rows - r : LANES, n, rounds, eps);
        return;
    }
    float s[64];
    for (long r = 0; r < rows; ++r) {
        float *m = c + r * n * n;
        for (int it = 0; it <= rounds; ++it) {
            if (it > 0) {
                for (int i = 0; i < n; ++i) {
                    float acc = 0.0f;
                    for (int j = 0; j < n; ++j) acc += m[i * n + j];
                    acc += eps;
                    for (int j = 0; j < n; ++j) m[i * n + j] /= acc;
                }
            }
            for (int j = 0; j < n; ++j) {
                float acc = 0.0f;
                for (int i = 0; i < n; ++i) acc += m[i * n + j];
                s[j] = acc + eps;
            }
            for (int i = 0; i < n; ++i)
                for (int j = 0; j < n; ++j) m[i * n + j] /= s[j];
        }
    }
}

/* res[r, k, :] = post[r, k] * out[r, :] + (comb[r, 0, k] * h[r, 0, :] + comb[r, 1, k] * h[r, 1, :] + ...)
   h, res [rows, n, d]; out [rows, d]; post [rows, n]; comb [rows, n, n] */
void hc_post(const float *h, const float *out, const float *post, const float *comb, float *res,
             long rows, int n, long d) {
    for (long r = 0; r < rows; ++r) {
        const float *hr = h + r * n * d, *o = out + r * d, *cr = comb + r * n * n;
        for (int k = 0; k < n; ++k) {
            float *y = res + (r * n + k) * d;
            float p = post[r * n + k], c0 = cr[k];
            for (long e = 0; e < d; ++e) y[e] = c0 * hr[e];
            for (int j = 1; j < n; ++j) {
                const float *hj = hr + j * d;
                float cj = cr[j * n + k];
                for (long e = 0; e < d; ++e) y[e] = y[e] + cj * hj[e];
            }
            for (long e = 0; e < d; ++e) y[e] = p * o[e] + y[e];
        }
    }
}

/* res[r, :] = sum over k of (w[r, k] * h[r, k, :]) in k order; h [rows, n, d], w [rows, n] */
void weighted_sum(const float *h, const float *w, float *res, long rows, int n, long d) {
    for (long r = 0; r < rows; ++r) {
        float *y = res + r * d;
        const float *hr = h + r * n * d;
        float w0 = w[r * n];
        for (long e = 0; e < d; ++e) y[e] = w0 * hr[e];
        for (int k = 1; k < n; ++k) {
            float wk = w[r * n + k];
            const float *hk = hr + k * d;
            for (long e = 0; e < d; ++e) y[e] = y[e] + wk * hk[e];
        }
    }
}

/* interleaved rope on the last 2*half channels of x [rows, m, dim]; cos, sin [rows, half]:
   (x0, x1) -> (x0*c + (-x1)*s, x1*c + x0*s); the other channels copied. */
void rope(const float *x, const float *cos, const float *sin, float *res, long rows, long m,
          long dim, long half) {
    long nope = dim - 2 * half;
    for (long r = 0; r < rows; ++r) {
        const float *c = cos + r * half, *s = sin + r * half;
        for (long h = 0; h < m; ++h) {
            const float *xi = x + (r * m + h) * dim;
            float *y = res + (r * m + h) * dim;
            for (long e = 0; e < nope; ++e) y[e] = xi[e];
            const float *xr = xi + nope;
            float *yr = y + nope;
            for (long i = 0; i < half; ++i) {
                float a = xr[2 * i], b = xr[2 * i + 1];
                yr[2 * i] = a * c[i] + (-b) * s[i];
                yr[2 * i + 1] = b * c[i] + a * s[i];
            }
        }
    }
}

/* mHC mix logits mix [rows, (2+n)*n] -> z [rows, 2n] = -(mix * scale[0|1] + base) (the pre and
   post sigmoids' exp arguments) and comb [rows, n*n] = mix * scale[2] + base (softmax input). */
void hc_mix(const float *mix, const float *scale, const float *base, float *z, float *comb, long rows, int n) {
    long width = (long)(2 + n) * n;
    for (long r = 0; r < rows; ++r) {
        const float *m = mix + r * width;
        float *zr = z + r * 2 * n, *cr = comb + r * n * n;
        for (int i = 0; i < n; ++i) zr[i] = -(m[i] * scale[0] + base[i]);
        for (int i = n; i < 2 * n; ++i) zr[i] = -(m[i] * scale[1] + base[i]);
        for (int j = 0; j < n * n; ++j) cr[j] = m[2 * n + j] * scale[2] + base[2 * n + j];
    }
}

/* After torch's exp(z) = e [rows, 2n] and softmax(comb): pre = 1/(e+1) + eps, post = 2 * (1/(e+1)),
   comb + eps then the Sinkhorn rounds (in place), y [rows, d] = the pre-weighted stream sum of
   h [rows, n, d]. */
void hc_finish(const float *e, float *comb, const float *h, float *post, float *y, long rows, int n, long d,
               int rounds, float eps) {
    float pre[64];
    for (long r = 0; r < rows; ++r) {
        const float *er = e + r * 2 * n;
        for (int i = 0; i < n; ++i) post[r * n + i] = (1.0f / (er[n + i] + 1.0f)) * 2.0f;
    }
    for (long j = 0; j < rows * n * n; ++j) comb[j] = comb[j] + eps;
    sinkhorn(comb, rows, n, rounds, eps);
    for (long r = 0; r < rows; ++r) {
        const float *er = e + r * 2 * n;
        for (int i = 0; i < n; ++i) pre[i] = 1.0f / (er[i] + 1.0f) + eps;
        weighted_sum(h + r * n * d, pre, y + r * d, 1, n, d);
    }
}

/* attend's softmax input: out[t, h, k] = raw[t, h, k] * scale (-inf where !mask[t, k]), out[t, h, K] =
   sink[h], then each row minus its max (a NaN anywhere makes the max NaN, as torch.max).
   raw [T, H, K], mask [T, K] (bool bytes), sink [H], out [T, H, K+1] */
void attn_logits(const float *raw, const unsigned char *mask, const float *sink, float *out, long rows, long heads,
                 long keys, float scale) {
    for (long t = 0; t < rows; ++t) {
        const unsigned char *m = mask + t * keys;
        for (long h = 0; h < heads; ++h) {
            const float *x = raw + (t * heads + h) * keys;
            float *y = out + (t * heads + h) * (keys + 1);
            for (long k = 0; k < keys; ++k) y[k] = m[k] ? x[k] * scale : -__builtin_inff();
            y[keys] = sink[h];
            float mx = y[0];
            for (long k = 1; k <= keys; ++k) {
                float v = y[k];
                if (v != v || (mx == mx && v > mx)) mx = v;
            }
            for (long k = 0; k <= keys; ++k) y[k] = y[k] - mx;
        }
    }
}
