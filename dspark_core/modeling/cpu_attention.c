/* Decode / verify attention over a KV cache in bfloat16 on AVX512-BF16 CPUs (dspark_core/modeling/cpu_attention.py).
 *
 * out[b, hq, t] = softmax(q[b, hq, t] . k[b, hq / g, :n]^T * scale) v[b, hq / g, :n], n = lens[b, t]: every query
 * attends a prefix of its row's keys (a decode or verify step over its slot's cache); n = 0 marks a padding query of
 * a ragged step (a row verifying fewer tokens than the step's T), skipped, its output 0. One task per (row, KV head)
 * takes the g query heads of its group at the row's live positions (up to M = g * T query rows):
 *   scores: q . k with `vdpbf16ps` (bf16 pairs into fp32), 16 keys at a time, their 16 sums in one transpose-add;
 *   softmax in fp32, e^x by a degree-6 series (1e-7 relative);
 *   p . v: each value row converted once per group of query rows whose sums stay in registers (6 rows at hd 64).
 * Head dims 64 and 128 get copies with constant trip counts (unrolled, in registers: 2-5x the generic code). The
 * output is rounded to bf16 (nearest even). Compiled at first use with `-march=native` by the Python module, which
 * falls back to SDPA when this fails. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef __AVX512BF16__
#error "needs AVX512-BF16"
#endif

#define MAX_D 256

static float* scratch(size_t floats) { /* a per-thread buffer kept across calls (OpenMP's threads persist): no
                                          allocation, nor the page faults of a fresh mmap, per step */
  static __thread float* buf = NULL;
  static __thread size_t cap = 0;
  if (floats > cap) {
    free(buf);
    cap = floats + floats / 2;
    buf = (float*)aligned_alloc(64, (cap * sizeof(float) + 63) / 64 * 64);
    if (!buf) cap = 0;
  }
  return buf;
}

static inline __m512 bf16x16(const uint16_t* p) { /* 16 bf16 -> 16 fp32: the bits shifted into the high half */
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
static inline __m512 exp16(__m512 x) { /* e^x to ~1e-7 relative: 2^n * 2^f, |f| <= 1/2, f's degree-6 series */
  x = _mm512_max_ps(x, _mm512_set1_ps(-100.f));  /* -inf (a masked score) -> e^-100, 0 once normalised */
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5403530393381608e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265069591007f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471805599453f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

static inline __m512 reduce16(const __m512* a) { /* lane l = sum of a[l]'s 16 lanes */
  __m512 t[8], u[4];
  for (int i = 0; i < 8; i++) t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2*i], a[2*i+1]), _mm512_unpackhi_ps(a[2*i], a[2*i+1]));
  for (int i = 0; i < 4; i++) u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2*i], t[2*i+1], 0x44), _mm512_shuffle_ps(t[2*i], t[2*i+1], 0xEE));
  __m512 v0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44), _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
  __m512 v1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44), _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x88), _mm512_shuffle_f32x4(v0, v1, 0xDD));
}
/* a[i * D / 16 + c] = sum_j p[i * sl + j] v[j] (16 lanes c of D) for `rows` query rows, each value row read once. */
static inline __attribute__((always_inline)) void pv_rows(const int64_t rows, const int64_t D, __m512* a,
                                                          const float* p, int64_t sl, const uint16_t* vb, int64_t vsl,
                                                          int64_t nmax) {
  const int64_t DC = D / 16;
  for (int64_t i = 0; i < rows * DC; i++) a[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nmax; j++) {
    const uint16_t* vr = vb + j * vsl;
    __m512 vv[MAX_D / 16];
    for (int64_t c = 0; c < DC; c++) vv[c] = bf16x16(vr + 16 * c);
    for (int64_t i = 0; i < rows; i++) {
      const __m512 pi = _mm512_set1_ps(p[i * sl + j]);
      for (int64_t c = 0; c < DC; c++) a[i * DC + c] = _mm512_fmadd_ps(pi, vv[c], a[i * DC + c]);
    }
  }
}

/* One (row b, KV head h) task: the M live query rows live[0..M) (of the group's G * T) over the keys kb / values vb,
   row live[i] attending n[i] keys; its scores go to row i of s. */
static inline __attribute__((always_inline)) void one_task(
    const int64_t D, const uint16_t* q, const uint16_t* kb, const uint16_t* vb, const int64_t* live, const int64_t* n,
    int64_t M, int64_t nmax, uint16_t* out, int64_t b, int64_t h, int64_t NH, int64_t G, int64_t T, const int64_t* qs,
    int64_t ksl, int64_t vsl, float scale, float* s, int64_t sl) {
  const int64_t DC = D / 16, DP = D / 32;
  const int64_t R = 24 / DC < 1 ? 1 : 24 / DC;
  for (int64_t i = 0; i < M; i++) {
    const int64_t m = live[i];
    const uint16_t* qr = q + b * qs[0] + (h * G + m / T) * qs[1] + (m % T) * qs[2];
    __m512bh qv[MAX_D / 32];
    for (int64_t c = 0; c < DP; c++) qv[c] = (__m512bh)_mm512_loadu_si512(qr + 32 * c);
    float* sm = s + i * sl;
    const int64_t nn = n[i];
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j0 = 0; j0 < nn; j0 += 16) {
      const int64_t jn = nn - j0 < 16 ? nn - j0 : 16;
      __m512 dot[16];
      for (int64_t jj = 0; jj < 16; jj++) {
        const uint16_t* kr = kb + (j0 + (jj < jn ? jj : 0)) * ksl;
        __m512 d0 = _mm512_setzero_ps();
        for (int64_t c = 0; c < DP; c++) d0 = _mm512_dpbf16_ps(d0, qv[c], (__m512bh)_mm512_loadu_si512(kr + 32 * c));
        dot[jj] = d0;
      }
      const __mmask16 keep = (__mmask16)(jn >= 16 ? 0xFFFFu : (1u << jn) - 1u);
      const __m512 x = _mm512_mask_blend_ps(keep, _mm512_set1_ps(-INFINITY), _mm512_mul_ps(reduce16(dot), _mm512_set1_ps(scale)));
      _mm512_store_ps(sm + j0, x);
      mx = _mm512_max_ps(mx, x);
    }
    const __m512 m1 = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < nn; j0 += 16) {  /* keys past nn in the last block: exactly 0 */
      const __mmask16 keep = (__mmask16)(nn - j0 >= 16 ? 0xFFFFu : (1u << (nn - j0)) - 1u);
      const __m512 e = _mm512_maskz_mov_ps(keep, exp16(_mm512_sub_ps(_mm512_load_ps(sm + j0), m1)));
      _mm512_store_ps(sm + j0, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
    for (int64_t j0 = 0; j0 < nn; j0 += 16) _mm512_store_ps(sm + j0, _mm512_mul_ps(_mm512_load_ps(sm + j0), inv));
    for (int64_t j = (nn + 15) / 16 * 16; j < nmax; j++) sm[j] = 0.f;
  }
  for (int64_t m0 = 0; m0 < M; m0 += R) {
    const int64_t r = M - m0 < R ? M - m0 : R;
    __m512 a[24];
    if (r == R)  /* a full group: constant trip counts once inlined, the sums in registers */
      pv_rows(R, D, a, s + m0 * sl, sl, vb, vsl, nmax);
    else
      pv_rows(r, D, a, s + m0 * sl, sl, vb, vsl, nmax);
    for (int64_t i = 0; i < r; i++) {
      const int64_t m = live[m0 + i];
      uint16_t* orow = out + ((b * NH + h * G + m / T) * T + m % T) * D;
      for (int64_t c = 0; c < DC; c++)
        _mm256_storeu_si256((__m256i*)(orow + 16 * c), (__m256i)_mm512_cvtneps_pbh(a[i * DC + c]));
    }
  }
}

int dspark_attention_bf16(const uint16_t* q, const uint16_t* k, const uint16_t* v, const int64_t* lens,
                          uint16_t* out, int64_t B, int64_t NH, int64_t NKV, int64_t T, int64_t D, int64_t L,
                          const int64_t* qs, const int64_t* ks, const int64_t* vs, float scale, int threads) {
  /* q [B, NH, T, D] strides qs[4]; k, v [B, NKV, L, D] strides ks[4], vs[4] (last stride 1 for all three);
     lens [B, T] contiguous, each in 1..L, or 0 for a padding query (output 0); out [B, NH, T, D] contiguous.
     Returns 0, 1 for a shape it does not take, 2 when a thread's buffer could not be allocated. */
  if (D % 32 || D > MAX_D || NH % NKV || qs[3] != 1 || ks[3] != 1 || vs[3] != 1) return 1;
  const int64_t G = NH / NKV, M = G * T;
  int failed = 0;
#pragma omp parallel num_threads(threads)
  {
    const int64_t sl = (L + 15) / 16 * 16;
    float* s = scratch((size_t)(M * sl));
    int64_t n[M], live[M];
    if (!s) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for schedule(static)
    for (int64_t task = 0; task < B * NKV; task++) {
      if (failed) continue;
      const int64_t b = task / NKV, h = task % NKV;
      int64_t nmax = 0, ml = 0;
      for (int64_t m = 0; m < M; m++) {
        const int64_t len = lens[b * T + m % T];
        if (len < 1) {  /* a padding query: no scores, a zero output (the caller drops it) */
          memset(out + ((b * NH + h * G + m / T) * T + m % T) * D, 0, (size_t)D * sizeof(uint16_t));
          continue;
        }
        live[ml] = m;
        n[ml] = len > L ? L : len;
        nmax = n[ml] > nmax ? n[ml] : nmax;
        ml++;
      }
      const uint16_t* kb = k + b * ks[0] + h * ks[1];
      const uint16_t* vb = v + b * vs[0] + h * vs[1];
      switch (D) {  /* the common head dims with constant trip counts */
        case 64: one_task(64, q, kb, vb, live, n, ml, nmax, out, b, h, NH, G, T, qs, ks[2], vs[2], scale, s, sl); break;
        case 128: one_task(128, q, kb, vb, live, n, ml, nmax, out, b, h, NH, G, T, qs, ks[2], vs[2], scale, s, sl);
          break;
        default: one_task(D, q, kb, vb, live, n, ml, nmax, out, b, h, NH, G, T, qs, ks[2], vs[2], scale, s, sl);
      }
    }
  }
  return failed ? 2 : 0;
}
