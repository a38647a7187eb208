// Every op's backward against central finite differences in double precision, on random
// inputs (never zeros), and the float build against the double one.
#include "trainer_ref/cpu_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

namespace tierd::trainer::cpu {
namespace {

using Vec = std::vector<double>;

Vec Random(size_t n, uint64_t seed, double scale = 1.0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-scale, scale);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

// L(x) = sum(R * f(x)) for a fixed random R. `forward` writes f(inputs) into out;
// `backward` adds dL/dinput into grads given dout = R. Checks every element of every input.
void CheckGradient(const std::vector<Vec*>& inputs, size_t out_size, const std::function<void(Vec&)>& forward,
                   const std::function<void(const Vec&, std::vector<Vec>&)>& backward, double tol = 1e-6) {
  const Vec r = Random(out_size, 99);
  Vec out(out_size);
  auto loss = [&] {
    forward(out);
    double l = 0;
    for (size_t i = 0; i < out_size; ++i) l += r[i] * out[i];
    return l;
  };
  loss();  // caches at the unperturbed point
  std::vector<Vec> grads;
  for (Vec* in : inputs) grads.emplace_back(in->size(), 0.0);
  backward(r, grads);
  const double eps = 1e-6;
  for (size_t k = 0; k < inputs.size(); ++k) {
    Vec& x = *inputs[k];
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + eps;
      const double up = loss();
      x[i] = saved - eps;
      const double down = loss();
      x[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      ASSERT_NEAR(grads[k][i], numeric, tol * std::max(1.0, std::abs(numeric)))
          << "input " << k << " element " << i;
    }
  }
  loss();
}

TEST(CpuOpsTest, EmbeddingGradient) {
  const int n = 6, c = 5, v = 4;
  std::vector<int32_t> tokens = {0, 3, 3, 1, 2, 3};
  Vec wte = Random(v * c, 1);
  CheckGradient({&wte}, n * c, [&](Vec& out) { EmbeddingForward(out.data(), tokens.data(), wte.data(), n, c); },
                [&](const Vec& dout, std::vector<Vec>& g) { EmbeddingBackward(g[0].data(), dout.data(), tokens.data(), n, c); });
}

TEST(CpuOpsTest, RmsNormGradient) {
  const int n = 4, c = 7;
  Vec in = Random(n * c, 2), weight = Random(c, 3);
  Vec rstd(n);
  CheckGradient({&in, &weight}, n * c,
                [&](Vec& out) { RmsNormForward(out.data(), rstd.data(), in.data(), weight.data(), n, c, 1e-5); },
                [&](const Vec& dout, std::vector<Vec>& g) {
                  RmsNormBackward(g[0].data(), g[1].data(), dout.data(), in.data(), weight.data(), rstd.data(), n, c);
                });
}

TEST(CpuOpsTest, MatmulGradient) {
  const int n = 3, ic = 5, oc = 4;
  Vec in = Random(n * ic, 4), weight = Random(oc * ic, 5);
  CheckGradient({&in, &weight}, n * oc, [&](Vec& out) { MatmulForward(out.data(), in.data(), weight.data(), n, ic, oc); },
                [&](const Vec& dout, std::vector<Vec>& g) {
                  MatmulBackward(g[0].data(), g[1].data(), dout.data(), in.data(), weight.data(), n, ic, oc);
                });
}

// theta^(-2i/D): RoPE's unscaled inverse frequencies.
Vec Frequencies(int d, double theta = 10000.0) {
  Vec f(d / 2);
  for (int i = 0; i < d / 2; ++i) f[i] = std::pow(theta, -2.0 * i / d);
  return f;
}

TEST(CpuOpsTest, BiasGradient) {
  const int n = 3, oc = 5;
  Vec bias = Random(oc, 21), base = Random(n * oc, 22);
  CheckGradient({&bias}, n * oc,
                [&](Vec& out) {
                  out = base;
                  BiasForward(out.data(), bias.data(), n, oc);
                },
                [&](const Vec& dout, std::vector<Vec>& g) { BiasBackward(g[0].data(), dout.data(), n, oc); });
}

TEST(CpuOpsTest, RopeGradient) {
  const int b = 2, t = 3, h = 2, d = 4;
  Vec x = Random(b * t * h * d, 6);
  const Vec freq = Frequencies(d);
  CheckGradient({&x}, x.size(),
                [&](Vec& out) {
                  out = x;
                  RopeForward(out.data(), b, t, h, d, freq.data());
                },
                [&](const Vec& dout, std::vector<Vec>& g) {
                  Vec turned = dout;
                  RopeBackward(turned.data(), b, t, h, d, freq.data());
                  for (size_t i = 0; i < turned.size(); ++i) g[0][i] += turned[i];
                });
}

TEST(CpuOpsTest, RopeKeepsPositionZeroAndNorms) {
  const int b = 1, t = 4, h = 1, d = 8;
  Vec x = Random(t * d, 7), y = x;
  const Vec freq = Frequencies(d);
  RopeForward(y.data(), b, t, h, d, freq.data());
  for (int e = 0; e < d; ++e) EXPECT_DOUBLE_EQ(y[e], x[e]) << "position 0 does not turn";
  for (int row = 0; row < t; ++row) {
    for (int i = 0; i < d / 2; ++i) {
      const double before = std::hypot(x[row * d + 2 * i], x[row * d + 2 * i + 1]);
      const double after = std::hypot(y[row * d + 2 * i], y[row * d + 2 * i + 1]);
      EXPECT_NEAR(before, after, 1e-12);
    }
  }
}

TEST(CpuOpsTest, AttentionGradientAndCausality) {
  const int b = 2, t = 4, h = 2, d = 3, c = h * d;
  Vec q = Random(b * t * c, 8), k = Random(b * t * c, 9), v = Random(b * t * c, 10);
  Vec att(b * h * t * t);
  CheckGradient({&q, &k, &v}, b * t * c,
                [&](Vec& out) { AttentionForward(out.data(), att.data(), q.data(), k.data(), v.data(), b, t, h, h, d); },
                [&](const Vec& dout, std::vector<Vec>& g) {
                  AttentionBackward(g[0].data(), g[1].data(), g[2].data(), dout.data(), att.data(), q.data(), k.data(),
                                    v.data(), b, t, h, h, d);
                });
  for (int row = 0; row < b * h * t; ++row) {
    const int ti = row % t;
    double sum = 0;
    for (int tj = 0; tj < t; ++tj) {
      if (tj > ti) {
        EXPECT_EQ(att[row * t + tj], 0.0) << "a token attends to the future";
      }
      sum += att[row * t + tj];
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
}

// Grouped-query attention: its gradients by finite differences, and its output equal to
// multi-head attention's with each key/value head repeated for its group of query heads.
TEST(CpuOpsTest, GroupedQueryAttentionGradientAndRepeatedHeads) {
  const int b = 2, t = 4, h = 4, d = 2;
  for (int kv : {1, 2}) {
    const int c = h * d, ckv = kv * d;
    Vec q = Random(b * t * c, 30 + kv), k = Random(b * t * ckv, 40 + kv), v = Random(b * t * ckv, 50 + kv);
    Vec att(b * h * t * t);
    CheckGradient(
        {&q, &k, &v}, b * t * c,
        [&](Vec& out) { AttentionForward(out.data(), att.data(), q.data(), k.data(), v.data(), b, t, h, kv, d); },
        [&](const Vec& dout, std::vector<Vec>& g) {
          AttentionBackward(g[0].data(), g[1].data(), g[2].data(), dout.data(), att.data(), q.data(), k.data(),
                            v.data(), b, t, h, kv, d);
        });
    Vec k_full(b * t * c), v_full(b * t * c);
    for (int row = 0; row < b * t; ++row) {
      for (int hi = 0; hi < h; ++hi) {
        for (int e = 0; e < d; ++e) {
          k_full[row * c + hi * d + e] = k[row * ckv + (hi / (h / kv)) * d + e];
          v_full[row * c + hi * d + e] = v[row * ckv + (hi / (h / kv)) * d + e];
        }
      }
    }
    Vec grouped(b * t * c), full(b * t * c), att_full(att.size());
    AttentionForward(grouped.data(), att.data(), q.data(), k.data(), v.data(), b, t, h, kv, d);
    AttentionForward(full.data(), att_full.data(), q.data(), k_full.data(), v_full.data(), b, t, h, h, d);
    EXPECT_EQ(grouped, full) << kv << " key/value heads";
  }
}

TEST(CpuOpsTest, SwiGluGradient) {
  const int n = 3, f = 5;
  Vec gate = Random(n * f, 11, 3.0), up = Random(n * f, 12);
  CheckGradient({&gate, &up}, n * f, [&](Vec& out) { SwiGluForward(out.data(), gate.data(), up.data(), n, f); },
                [&](const Vec& dout, std::vector<Vec>& g) {
                  SwiGluBackward(g[0].data(), g[1].data(), dout.data(), gate.data(), up.data(), n, f);
                });
}

TEST(CpuOpsTest, CrossEntropyGradientWithAnIgnoredRow) {
  const int n = 4, v = 6;
  std::vector<int32_t> targets = {2, -1, 5, 0};
  Vec logits = Random(n * v, 13, 4.0);
  CheckGradient({&logits}, 1, [&](Vec& out) { out[0] = CrossEntropyForward(logits.data(), targets.data(), n, v); },
                [&](const Vec& dout, std::vector<Vec>& g) {
                  Vec d(n * v);
                  CrossEntropyBackward(d.data(), logits.data(), targets.data(), n, v);
                  for (size_t i = 0; i < d.size(); ++i) g[0][i] += dout[0] * d[i];
                });
  // Uniform logits: the loss is log(V).
  Vec flat(n * v, 0.5);
  EXPECT_NEAR(CrossEntropyForward(flat.data(), targets.data(), n, v), std::log(6.0), 1e-12);
  // A block of rows at a time (the head's chunks): the same sum and the same gradients, bit for bit.
  double total = 0;
  for (int row = 0; row < n; row += 3) total = CrossEntropySum(logits.data() + row * v, targets.data() + row,
                                                               std::min(3, n - row), v, total);
  EXPECT_EQ(total / 3, CrossEntropyForward(logits.data(), targets.data(), n, v));
  Vec whole(n * v), blocks(n * v);
  CrossEntropyBackward(whole.data(), logits.data(), targets.data(), n, v);
  for (int row = 0; row < n; row += 3) {
    CrossEntropyBackward(blocks.data() + row * v, logits.data() + row * v, targets.data() + row, std::min(3, n - row),
                         v, /*counted=*/3);
  }
  EXPECT_EQ(blocks, whole);
}

TEST(CpuOpsTest, FloatAgreesWithDouble) {
  const int b = 2, t = 5, h = 2, d = 4, c = h * d;
  Vec q = Random(b * t * c, 14), k = Random(b * t * c, 15), v = Random(b * t * c, 16);
  Vec out(b * t * c), att(b * h * t * t);
  AttentionForward(out.data(), att.data(), q.data(), k.data(), v.data(), b, t, h, h, d);
  std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end());
  std::vector<float> outf(out.size()), attf(att.size());
  AttentionForward(outf.data(), attf.data(), qf.data(), kf.data(), vf.data(), b, t, h, h, d);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(outf[i], out[i], 1e-5) << i;
}

// The matmuls split rows across threads; each sum still runs in the plain loop's order,
// so the bits equal a single-threaded loop's (sizes large enough to use the threads).
TEST(CpuOpsTest, ThreadedMatmulsGiveThePlainLoopsBits) {
  const int n = 96, ic = 80, oc = 72;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n * ic), w(oc * ic), dy(n * oc);
  for (auto* v : {&x, &w, &dy}) for (float& f : *v) f = normal(rng);
  std::vector<float> y(n * oc), dx(n * ic, 0.5f), dw(oc * ic, 0.25f);
  MatmulForward(y.data(), x.data(), w.data(), n, ic, oc);
  MatmulBackward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), n, ic, oc);
  std::vector<float> y_ref(n * oc), dx_ref(n * ic, 0.5f), dw_ref(oc * ic, 0.25f);
  for (int i = 0; i < n; ++i) {
    for (int o = 0; o < oc; ++o) {
      float sum = 0;
      for (int k = 0; k < ic; ++k) sum += x[i * ic + k] * w[o * ic + k];
      y_ref[i * oc + o] = sum;
      for (int k = 0; k < ic; ++k) {
        dx_ref[i * ic + k] += dy[i * oc + o] * w[o * ic + k];
        dw_ref[o * ic + k] += dy[i * oc + o] * x[i * ic + k];
      }
    }
  }
  EXPECT_EQ(y, y_ref);
  EXPECT_EQ(dx, dx_ref);
  EXPECT_EQ(dw, dw_ref);
}

}  // namespace
}  // namespace tierd::trainer::cpu
