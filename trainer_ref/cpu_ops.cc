#include "trainer_ref/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "trainer_ref/parallel.h"

namespace tierd::trainer::cpu {

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, int n, int c) {
  for (int i = 0; i < n; ++i) std::copy(wte + int64_t{tokens[i]} * c, wte + int64_t{tokens[i]} * c + c, out + int64_t{i} * c);
}

template <typename T>
void EmbeddingBackward(T* dwte, const T* dout, const int32_t* tokens, int n, int c) {
  for (int i = 0; i < n; ++i) {
    T* row = dwte + int64_t{tokens[i]} * c;
    const T* g = dout + int64_t{i} * c;
    for (int j = 0; j < c; ++j) row[j] += g[j];
  }
}

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* in, const T* weight, int n, int c, T eps) {
  for (int i = 0; i < n; ++i) {
    const T* x = in + int64_t{i} * c;
    T sum = 0;
    for (int j = 0; j < c; ++j) sum += x[j] * x[j];
    const T r = T(1) / std::sqrt(sum / c + eps);
    rstd[i] = r;
    T* y = out + int64_t{i} * c;
    for (int j = 0; j < c; ++j) y[j] = x[j] * r * weight[j];
  }
}

template <typename T>
void RmsNormBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, const T* rstd, int n, int c) {
  for (int i = 0; i < n; ++i) {
    const T* x = in + int64_t{i} * c;
    const T* dy = dout + int64_t{i} * c;
    const T r = rstd[i];
    // dx_j = r (w_j dy_j - x_j r^2 mean_k(dy_k w_k x_k))
    T dot = 0;
    for (int j = 0; j < c; ++j) dot += dy[j] * weight[j] * x[j];
    const T mean = dot / c;
    T* dx = din + int64_t{i} * c;
    for (int j = 0; j < c; ++j) {
      dx[j] += r * (weight[j] * dy[j] - x[j] * r * r * mean);
      dweight[j] += dy[j] * x[j] * r;
    }
  }
}


template <typename T>
void MatmulForward(T* out, const T* in, const T* weight, int n, int ic, int oc) {
  ParallelFor(n, double(n) * ic * oc, [&](int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const T* x = in + int64_t{i} * ic;
      for (int o = 0; o < oc; ++o) {
        const T* w = weight + int64_t{o} * ic;
        T sum = 0;
        for (int k = 0; k < ic; ++k) sum += x[k] * w[k];
        out[int64_t{i} * oc + o] = sum;
      }
    }
  });
}

// din[i] += sum_o dout[i][o] w[o] (rows split across threads), then
// dweight[o] += sum_i dout[i][o] in[i] (output rows split): the sums run in the order of
// the plain double loop, so any thread count gives the same bits.
template <typename T>
void MatmulBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, int n, int ic, int oc) {
  const double work = double(n) * ic * oc;
  ParallelFor(n, work, [&](int begin, int end) {
    for (int i = begin; i < end; ++i) {
      const T* g = dout + int64_t{i} * oc;
      T* dx = din + int64_t{i} * ic;
      for (int o = 0; o < oc; ++o) {
        const T go = g[o];
        const T* w = weight + int64_t{o} * ic;
        for (int k = 0; k < ic; ++k) dx[k] += go * w[k];
      }
    }
  });
  ParallelFor(oc, work, [&](int begin, int end) {
    for (int o = begin; o < end; ++o) {
      T* dw = dweight + int64_t{o} * ic;
      for (int i = 0; i < n; ++i) {
        const T go = dout[int64_t{i} * oc + o];
        const T* x = in + int64_t{i} * ic;
        for (int k = 0; k < ic; ++k) dw[k] += go * x[k];
      }
    }
  });
}

template <typename T>
void BiasForward(T* out, const T* bias, int n, int oc) {
  for (int i = 0; i < n; ++i) {
    for (int o = 0; o < oc; ++o) out[int64_t{i} * oc + o] += bias[o];
  }
}

template <typename T>
void BiasBackward(T* dbias, const T* dout, int n, int oc) {
  for (int i = 0; i < n; ++i) {
    for (int o = 0; o < oc; ++o) dbias[o] += dout[int64_t{i} * oc + o];
  }
}

namespace {

// Turns each (2i, 2i+1) pair by +/- its angle.
template <typename T>
void Rotate(T* x, int b, int t, int h, int d, const double* inv_freq, T sign) {
  for (int row = 0; row < b * t; ++row) {
    const int pos = row % t;
    for (int head = 0; head < h; ++head) {
      T* v = x + (int64_t{row} * h + head) * d;
      for (int i = 0; i < d / 2; ++i) {
        const T angle = sign * T(pos * inv_freq[i]);
        const T cs = std::cos(angle), sn = std::sin(angle);
        const T a = v[2 * i], c = v[2 * i + 1];
        v[2 * i] = a * cs - c * sn;
        v[2 * i + 1] = a * sn + c * cs;
      }
    }
  }
}

}  // namespace

template <typename T>
void RopeForward(T* x, int b, int t, int h, int d, const double* inv_freq) {
  Rotate(x, b, t, h, d, inv_freq, T(1));
}

template <typename T>
void RopeBackward(T* dx, int b, int t, int h, int d, const double* inv_freq) {
  Rotate(dx, b, t, h, d, inv_freq, T(-1));  // the transpose of a rotation is the opposite one
}

template <typename T>
void AttentionForward(T* out, T* att, const T* q, const T* k, const T* v, int b, int t, int h, int kv_heads, int d) {
  const int c = h * d, ckv = kv_heads * d, group = h / kv_heads;
  const T scale = T(1) / std::sqrt(T(d));
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      const int hk = hi / group;
      for (int ti = 0; ti < t; ++ti) {
        const T* qv = q + (int64_t{bi} * t + ti) * c + hi * d;
        T* p = att + ((int64_t{bi} * h + hi) * t + ti) * t;
        T max = -INFINITY;
        for (int tj = 0; tj <= ti; ++tj) {
          const T* kv = k + (int64_t{bi} * t + tj) * ckv + hk * d;
          T s = 0;
          for (int e = 0; e < d; ++e) s += qv[e] * kv[e];
          p[tj] = s * scale;
          max = std::max(max, p[tj]);
        }
        T sum = 0;
        for (int tj = 0; tj <= ti; ++tj) sum += (p[tj] = std::exp(p[tj] - max));
        for (int tj = 0; tj <= ti; ++tj) p[tj] /= sum;
        for (int tj = ti + 1; tj < t; ++tj) p[tj] = 0;
        T* o = out + (int64_t{bi} * t + ti) * c + hi * d;
        std::fill(o, o + d, T(0));
        for (int tj = 0; tj <= ti; ++tj) {
          const T* vv = v + (int64_t{bi} * t + tj) * ckv + hk * d;
          for (int e = 0; e < d; ++e) o[e] += p[tj] * vv[e];
        }
      }
    }
  }
}

template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q, const T* k, const T* v, int b,
                       int t, int h, int kv_heads, int d) {
  const int c = h * d, ckv = kv_heads * d, group = h / kv_heads;
  const T scale = T(1) / std::sqrt(T(d));
  std::vector<T> dp(t);
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      const int hk = hi / group;
      for (int ti = 0; ti < t; ++ti) {
        const T* p = att + ((int64_t{bi} * h + hi) * t + ti) * t;
        const T* go = dout + (int64_t{bi} * t + ti) * c + hi * d;
        // out_t = sum_j p_j v_j: dv_j += p_j go, dp_j = go . v_j
        T pdp = 0;
        for (int tj = 0; tj <= ti; ++tj) {
          const T* vv = v + (int64_t{bi} * t + tj) * ckv + hk * d;
          T* dvv = dv + (int64_t{bi} * t + tj) * ckv + hk * d;
          T s = 0;
          for (int e = 0; e < d; ++e) {
            dvv[e] += p[tj] * go[e];
            s += go[e] * vv[e];
          }
          dp[tj] = s;
          pdp += p[tj] * s;
        }
        // softmax: ds_j = p_j (dp_j - sum_k p_k dp_k); s_j = scale q . k_j
        const T* qv = q + (int64_t{bi} * t + ti) * c + hi * d;
        T* dqv = dq + (int64_t{bi} * t + ti) * c + hi * d;
        for (int tj = 0; tj <= ti; ++tj) {
          const T ds = p[tj] * (dp[tj] - pdp) * scale;
          const T* kv = k + (int64_t{bi} * t + tj) * ckv + hk * d;
          T* dkv = dk + (int64_t{bi} * t + tj) * ckv + hk * d;
          for (int e = 0; e < d; ++e) {
            dqv[e] += ds * kv[e];
            dkv[e] += ds * qv[e];
          }
        }
      }
    }
  }
}

namespace {
template <typename T>
T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
}  // namespace

template <typename T>
void SwiGluForward(T* out, const T* gate, const T* up, int n, int f) {
  for (int64_t i = 0; i < int64_t{n} * f; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

template <typename T>
void SwiGluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int n, int f) {
  for (int64_t i = 0; i < int64_t{n} * f; ++i) {
    const T s = Sigmoid(gate[i]);
    dgate[i] += dout[i] * up[i] * s * (T(1) + gate[i] * (T(1) - s));
    dup[i] += dout[i] * gate[i] * s;
  }
}

template <typename T>
T CrossEntropySum(const T* logits, const int32_t* targets, int n, int v, T total) {
  for (int i = 0; i < n; ++i) {
    if (targets[i] < 0) continue;
    const T* z = logits + int64_t{i} * v;
    const T max = *std::max_element(z, z + v);
    T sum = 0;
    for (int j = 0; j < v; ++j) sum += std::exp(z[j] - max);
    total += std::log(sum) + max - z[targets[i]];
  }
  return total;
}

template <typename T>
T CrossEntropyForward(const T* logits, const int32_t* targets, int n, int v) {
  int counted = 0;
  for (int i = 0; i < n; ++i) counted += targets[i] >= 0;
  return counted == 0 ? T(0) : CrossEntropySum(logits, targets, n, v, T(0)) / counted;
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int n, int v) {
  int counted = 0;
  for (int i = 0; i < n; ++i) counted += targets[i] >= 0;
  CrossEntropyBackward(dlogits, logits, targets, n, v, counted);
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int n, int v, int counted) {
  for (int i = 0; i < n; ++i) {
    T* dz = dlogits + int64_t{i} * v;
    if (targets[i] < 0 || counted == 0) {
      std::fill(dz, dz + v, T(0));
      continue;
    }
    const T* z = logits + int64_t{i} * v;
    const T max = *std::max_element(z, z + v);
    T sum = 0;
    for (int j = 0; j < v; ++j) sum += (dz[j] = std::exp(z[j] - max));
    for (int j = 0; j < v; ++j) dz[j] = dz[j] / sum / counted;
    dz[targets[i]] -= T(1) / counted;
  }
}

#define TIERD_INSTANTIATE(T)                                                                                      \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, int, int);                                      \
  template void EmbeddingBackward<T>(T*, const T*, const int32_t*, int, int);                                     \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int, int, T);                                       \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int);                     \
  template void MatmulForward<T>(T*, const T*, const T*, int, int, int);                                          \
  template void MatmulBackward<T>(T*, T*, const T*, const T*, const T*, int, int, int);                           \
  template void BiasForward<T>(T*, const T*, int, int);                                                          \
  template void BiasBackward<T>(T*, const T*, int, int);                                                          \
  template void RopeForward<T>(T*, int, int, int, int, const double*);                                            \
  template void RopeBackward<T>(T*, int, int, int, int, const double*);                                           \
  template void AttentionForward<T>(T*, T*, const T*, const T*, const T*, int, int, int, int, int);               \
  template void AttentionBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int, int, int, \
                                     int, int);                                                                   \
  template void SwiGluForward<T>(T*, const T*, const T*, int, int);                                               \
  template void SwiGluBackward<T>(T*, T*, const T*, const T*, const T*, int, int);                                \
  template T CrossEntropyForward<T>(const T*, const int32_t*, int, int);                                          \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, int, int);                                  \
  template T CrossEntropySum<T>(const T*, const int32_t*, int, int, T);                                           \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, int, int, int);

TIERD_INSTANTIATE(float)
TIERD_INSTANTIATE(double)
#undef TIERD_INSTANTIATE

}  // namespace tierd::trainer::cpu
