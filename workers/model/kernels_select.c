
/* MoE routing plan over assignments a = token*k + slot with expert ids flat [num]: this rank's
   experts lo..hi-1 get whole 8-row tiles in ascending expert id, assignments ascending inside
   an expert. pos[a] = the assignment's tile row (-1: another rank's expert), tile_src [tiles*8]
   = its token (-1: a zero pad row), tile_expert [tiles] = local expert; counts [hi-lo] scratch.
   Returns the number of tiles (tile arrays hold at least num/8 + hi-lo tiles). */
long moe_plan(const long *flat, long num, int k, long lo, long hi, long *counts, long *pos, long *tile_src,
              long *tile_expert) {
    long ne = hi - lo, tiles = 0;
    for (long e = 0; e < ne; ++e) counts[e] = 0;
    for (long a = 0; a < num; ++a)
        if (flat[a] >= lo && flat[a] < hi) counts[flat[a] - lo] += 1;
    for (long e = 0; e < ne; ++e) { /* counts -> each expert's first tile row */
        long c = counts[e], t = (c + 7) / 8;
        for (long i = 0; i < t; ++i) tile_expert[tiles + i] = e;
        counts[e] = tiles * 8;
        tiles += t;
    }
    for (long i = 0; i < tiles * 8; ++i) tile_src[i] = -1;
    for (long a = 0; a < num; ++a) {
        long e = flat[a];
        if (e >= lo && e < hi) {
            long p = counts[e - lo]++;
            pos[a] = p;
            tile_src[p] = a / k;
        } else {
            pos[a] = -1;
        }
    }
    return tiles;
}

/* out [n, d] rows of x [*, d] by src [n] (-1: zeros) */
void gather_rows(const float *x, const long *src, float *out, long n, long d) {
    for (long i = 0; i < n; ++i) {
        float *o = out + i * d;
        if (src[i] < 0)
            for (long e = 0; e < d; ++e) o[e] = 0.0f;
        else
            for (long e = 0; e < d; ++e) o[e] = x[src[i] * d + e];
    }
}

/* out[t] = ((0 + y_a0 * w_a0) + y_a1 * w_a1) + ... over the token's k slots in ascending expert
   id (stable), y_a = yt[pos[a]] or 0 for another rank's expert; yt [tiles*8, d], w, flat [T*k] */
void moe_combine(const float *yt, const long *pos, const float *w, const long *flat, float *out, long rows, int k,
                 long d) {
    int order[64];
    for (long t = 0; t < rows; ++t) {
        const long *ids = flat + t * k;
        for (int j = 0; j < k; ++j) { /* stable insertion sort of the slots by expert id */
            int i = j;
            while (i > 0 && ids[order[i - 1]] > ids[j]) {
                order[i] = order[i - 1];
                --i;
            }
            order[i] = j;
        }
        float *o = out + t * d;
        for (long e = 0; e < d; ++e) o[e] = 0.0f;
        for (int j = 0; j < k; ++j) {
            long a = t * k + order[j], p = pos[a];
            float wa = w[a];
            for (long e = 0; e < d; ++e) o[e] = o[e] + (p >= 0 ? yt[p * d + e] : 0.0f) * wa;
        }
    }
}

/* a beats b in a descending sort: greater, NaN above every number (torch's sort order) */
static int beats(float a, float b) { return a > b || (a != a && b == b); }

/* The indexer's choice: out [rows, topk] = the slots of each row's topk best entries in
   descending score, ties to the lowest entry (a stable descending sort's first topk); an entry
   with slot < 0 scores -inf; -1 at ranks >= the row's num_visible or >= n.
   score, slots [rows, n]; num_visible [rows]. */
void topk_slots(const float *score, const long *slots, const long *num_visible, long *out, long rows, long n,
                int topk) {
    long best[1024];
    float val[1024];
    for (long r = 0; r < rows; ++r) {
        const float *sr = score + r * n;
        const long *lr = slots + r * n;
        int m = 0;
        for (long c = 0; c < n; ++c) {
            float v = lr[c] >= 0 ? sr[c] : -__builtin_inff();
            if (m == topk && !beats(v, val[m - 1])) continue;
            int i = m < topk ? m++ : topk - 1;
            while (i > 0 && beats(v, val[i - 1])) {
                best[i] = best[i - 1];
                val[i] = val[i - 1];
                --i;
            }
            best[i] = c;
            val[i] = v;
        }
        for (int j = 0; j < topk; ++j) out[r * topk + j] = (j < m && j < num_visible[r]) ? lr[best[j]] : -1;
    }
}

/* SwiGLU around torch's exp, in place. pre: g = min(g, limit) (NaN kept), z = -g (exp's argument).
   post: u = (g / (e + 1)) * clamp(u, -limit, limit) with e = exp(z); g, z, e, u [n]. */
void swiglu_pre(float *g, float *z, long n, float limit) {
    for (long i = 0; i < n; ++i) {
        float v = g[i] > limit ? limit : g[i];
        g[i] = v;
        z[i] = -v;
    }
}

void swiglu_post(const float *g, const float *e, float *u, long n, float limit) {
    for (long i = 0; i < n; ++i) {
        float v = u[i] < -limit ? -limit : (u[i] > limit ? limit : u[i]);
        u[i] = (g[i] / (e[i] + 1.0f)) * v;
    }
}

/* The router's choice: with bias, idx [rows, k] = each row's k best experts by scores + bias in
   descending order, ties to the lowest id (a stable descending sort's first k, NaN first);
   without, idx is given (hash routing). Then w [rows, k] = scores at idx. scores [rows, e]. */
void route_topk(const float *scores, const float *bias, long *idx, float *w, long rows, long e, int k) {
    float val[64];
    for (long r = 0; r < rows; ++r) {
        const float *s = scores + r * e;
        long *ir = idx + r * k;
        if (bias) {
            int m = 0;
            for (long c = 0; c < e; ++c) {
                float v = s[c] + bias[c];
                if (m == k && !beats(v, val[m - 1])) continue;
                int i = m < k ? m++ : k - 1;
                while (i > 0 && beats(v, val[i - 1])) {
                    ir[i] = ir[i - 1];
                    val[i] = val[i - 1];
                    --i;
                }
                ir[i] = c;
                val[i] = v;
            }
        }
        for (int j = 0; j < k; ++j) w[r * k + j] = s[ir[j]];
    }
}
