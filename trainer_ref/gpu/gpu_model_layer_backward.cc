// A decoder layer's backward (GpuModel::LayerBackward): gpu_model.cc's forward, in reverse.
#include <optional>

#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_internal.h"
#ifdef TIERD_HAVE_CUDNN
#include "trainer_ref/kernels/cudnn_attention.h"
#endif

namespace tierd::trainer::gpu {

// Layer l's backward from its activations `a` (saved, or recomputed into the workspace): dx
// (fp32, the residual stream's gradient) turns from that of the layer's output into that of
// its input; the layer's weight gradients (acquired) are added into, or, `fresh_grads`, the
// linear maps' are written (their first contribution of the step: no zeros to read).
absl::Status GpuModel::LayerBackward(int l, const Acts& a, float* dx, bool fresh_grads) {
  [[maybe_unused]] const auto [n, c, f, h, d, kvh, qd, kd, nc] = DimsOf(config_, batch_ * seq_);
  const Layer& w = layers_[l];
  // din += dout x W, dW += dout^T x in: bf16, or (an FP8 layer) from the codes of the last
  // `cast` input.
  Fp8Linear* fp8 = LayerFp8(l);
  const bool codes = fp8 != nullptr && ReadsCodes(l + 1);
  Fp8Codes in8_t;
  // `i`: the input's index in Acts::in_scale_inv, where the forward kept its codes transposed.
  auto cast = [&](const Bf16* in, LinearIndex first, int cols, int i = -1) {
    if (fp8 == nullptr) return;
    if (a.inputs_transposed && i >= 0) {
      in8_t = {reinterpret_cast<const uint8_t*>(in), fp8->InputScalesHoldWithinStep()
                                                          ? fp8->InputCodes(l, first).scale_inv
                                                          : a.in_scale_inv + Acts::kScaleStride * i};
      return;
    }
    Timed(kFp8Cast, [&] {
      in8_t = fp8->QuantizeInputTransposed(l, first, in, n, cols, stream_);
      return 0;
    });
  };
  // `first`: din's first contribution, written (din = ...) rather than added, so no zeroing.
  auto linear = [&](Bf16* din, const Bf16* dout, const Bf16* in, size_t e, LinearIndex k, int ic, int oc, bool first) {
    return TimedFlops(kGemm, 4.0 * n * ic * oc, [&] {
      return codes ? fp8->BackwardFromCodes(din, G(e), dout, in8_t, l, k, CodesOf(l, k), n, ic, oc, stream_, !first,
                                            !fresh_grads)
             : fp8 != nullptr
                 ? fp8->Backward(din, G(e), dout, in8_t, l, k, W(e), n, ic, oc, stream_, !first, !fresh_grads)
                 : gemm_->Backward(din, G(e), dout, in, W(e), n, ic, oc, stream_, !first, !fresh_grads);
    });
  };
  // x_out = x_mid + swiglu(h2 W1^T, h2 W3^T) W2^T. dx in bf16: written beside dx by the norm
  // backward that made dx last (the layer above's, or the head's), else converted here.
  if (dx16_holds_ != dx) {
    Timed(kElementwise, [&] {
      ToBf16(dx16_, dx, static_cast<int64_t>(nc), stream_);
      return 0;
    });
    dx16_holds_ = dx;
  }
  cast(a.s, kLinearDown, f, 2);
  RETURN_IF_ERROR(linear(ds_, dx16_, a.s, w.w2, kLinearDown, f, c, /*first=*/true));
  // Under delayed scaling the gate's and up's gradient scales are known already: SwiGLU's
  // backward writes their E5M2 codes (into dg_'s and du_'s room) instead of bf16 tensors that
  // the conversions would read again.
  std::optional<Fp8Linear::EncodeTarget> to_gate, to_up;
  if (fp8 != nullptr) {
    to_gate = fp8->OutputGradientTarget(l, kLinearGate);
    to_up = fp8->OutputGradientTarget(l, kLinearUp);
  }
  if (to_gate.has_value() && to_up.has_value()) {
    // The codes (n, f) in the first half of each bf16 buffer, and where the shape allows, the
    // same transposed (f, n) in the second: what the weight gradients read.
    auto* dg8 = reinterpret_cast<uint8_t*>(dg_);
    auto* du8 = reinterpret_cast<uint8_t*>(du_);
    const int64_t nf = static_cast<int64_t>(n) * f;
    uint8_t *dg8_t = dg8 + nf, *du8_t = du8 + nf;
    Timed(kElementwise, [&] {
      if (!SwiGluBackwardFp8Transposed(dg8, du8, dg8_t, du8_t, ds_, a.g, a.u, n, f, to_gate->scale, to_up->scale,
                                       to_gate->amax, to_up->amax, stream_)) {
        SwiGluBackwardFp8(dg8, du8, ds_, a.g, a.u, nf, to_gate->scale, to_up->scale, to_gate->amax, to_up->amax,
                          stream_);
        dg8_t = du8_t = nullptr;
      }
      return 0;
    });
    cast(a.h2, kLinearGate, c, 1);
    auto from_codes = [&](const uint8_t* dout8, const uint8_t* dout8_t, size_t e, LinearIndex k, bool first) {
      return TimedFlops(kGemm, 4.0 * n * c * f, [&] {
        return fp8->BackwardFromOutputCodes(dh_, G(e), dout8, in8_t, l, k, codes ? nullptr : W(e),
                                            codes ? CodesOf(l, k) : Fp8Codes{}, n, c, f, stream_, !first,
                                            !fresh_grads, dout8_t);
      });
    };
    RETURN_IF_ERROR(from_codes(dg8, dg8_t, w.w1, kLinearGate, /*first=*/true));
    RETURN_IF_ERROR(from_codes(du8, du8_t, w.w3, kLinearUp, /*first=*/false));
  } else {
    Timed(kElementwise, [&] {
      SwiGluBackward(dg_, du_, ds_, a.g, a.u, n, f, stream_);
      return 0;
    });
    cast(a.h2, kLinearGate, c, 1);
    RETURN_IF_ERROR(linear(dh_, dg_, a.h2, w.w1, kLinearGate, c, f, /*first=*/true));
    RETURN_IF_ERROR(linear(dh_, du_, a.h2, w.w3, kLinearUp, c, f, /*first=*/false));
  }
  Timed(kElementwise, [&] {  // dx16_ = dx in bf16, for the attention's output map
    RmsNormBackward(dx, G(w.mlp_norm), dh_, a.x_mid, N(w.mlp_norm), a.rstd2, n, c, scratch_, stream_, dx16_);
    return 0;
  });
  // x_mid = x_in + attention(rope(h1 Wq^T), rope(h1 Wk^T), h1 Wv^T) Wo^T
  cast(a.a, kLinearO, qd);
  RETURN_IF_ERROR(linear(da_, dx16_, a.a, w.wo, kLinearO, qd, c, /*first=*/true));
  const int64_t scratch_bytes = AttentionBackwardScratchBytes(batch_, seq_, h, d);
  RETURN_IF_ERROR(TimedFlops(kAttention, AttentionFlops(batch_, seq_, h, d, true), [&] {
    if (cudnn_attention_ != nullptr) {  // dK, dV of the key/value heads directly
      return cudnn_attention_->Backward(dq_, dk_, dv_, da_, a.a, a.lse, a.q, a.k, a.v, attention_scratch_, stream_);
    }
    if (!Grouped()) {
      return Cuda(AttentionBackward(dq_, dk_, dv_, da_, a.a, a.lse, attention_scratch_, scratch_bytes, a.q, a.k, a.v,
                                    batch_, seq_, h, d, stream_),
                  "attention backward");
    }
    RepeatKvHeads(k_full_, a.k, n, h, kvh, d, stream_);
    RepeatKvHeads(v_full_, a.v, n, h, kvh, d, stream_);
    RETURN_IF_ERROR(Cuda(AttentionBackward(dq_, dk_full_, dv_full_, da_, a.a, a.lse, attention_scratch_, scratch_bytes,
                                           a.q, k_full_, v_full_, batch_, seq_, h, d, stream_),
                         "attention backward"));
    SumKvHeadGroups(dk_, dk_full_, n, h, kvh, d, stream_);
    SumKvHeadGroups(dv_, dv_full_, n, h, kvh, d, stream_);
    return absl::OkStatus();
  }));
  // Under delayed scaling (no biases to take from the turned gradients) RoPE's backward of dq
  // and dk writes their E5M2 codes, plain and transposed, into the MLP's gradient rooms (free
  // by now), instead of turning the bf16 tensors for the conversions to read again.
  struct RopedCodes {
    uint8_t *plain = nullptr, *transposed = nullptr;
  } q8, k8;
  if (fp8 != nullptr && !config_.qkv_bias && static_cast<int64_t>(qd) <= f && static_cast<int64_t>(kd) <= f) {
    const auto to_q = fp8->OutputGradientTarget(l, kLinearQ), to_k = fp8->OutputGradientTarget(l, kLinearK);
    auto* q_room = reinterpret_cast<uint8_t*>(dg_);
    auto* k_room = reinterpret_cast<uint8_t*>(du_);
    Timed(kElementwise, [&] {
      if (to_q.has_value() && RopeBackwardFp8Transposed(q_room, q_room + static_cast<int64_t>(n) * qd, dq_, batch_,
                                                        seq_, h, d, rope_, to_q->scale, true, to_q->amax, stream_)) {
        q8 = {q_room, q_room + static_cast<int64_t>(n) * qd};
      }
      if (to_k.has_value() && RopeBackwardFp8Transposed(k_room, k_room + static_cast<int64_t>(n) * kd, dk_, batch_,
                                                        seq_, kvh, d, rope_, to_k->scale, true, to_k->amax, stream_)) {
        k8 = {k_room, k_room + static_cast<int64_t>(n) * kd};
      }
      return 0;
    });
  }
  Timed(kElementwise, [&] {
    if (q8.plain == nullptr) RopeBackward(dq_, batch_, seq_, h, d, rope_, stream_);
    if (k8.plain == nullptr) RopeBackward(dk_, batch_, seq_, kvh, d, rope_, stream_);
    if (config_.qkv_bias) {
      BiasBackward(G(w.bq), dq_, n, qd, scratch_, stream_);
      BiasBackward(G(w.bk), dk_, n, kd, scratch_, stream_);
      BiasBackward(G(w.bv), dv_, n, kd, scratch_, stream_);
    }
    return 0;
  });
  cast(a.h1, kLinearQ, c, 0);
  auto roped = [&](const RopedCodes& codes8, const Bf16* dout, size_t e, LinearIndex k, int oc, bool first) {
    if (codes8.plain == nullptr) return linear(dh_, dout, a.h1, e, k, c, oc, first);
    return TimedFlops(kGemm, 4.0 * n * c * oc, [&] {
      return fp8->BackwardFromOutputCodes(dh_, G(e), codes8.plain, in8_t, l, k, codes ? nullptr : W(e),
                                          codes ? CodesOf(l, k) : Fp8Codes{}, n, c, oc, stream_, !first, !fresh_grads,
                                          codes8.transposed);
    });
  };
  RETURN_IF_ERROR(roped(q8, dq_, w.wq, kLinearQ, qd, /*first=*/true));
  RETURN_IF_ERROR(roped(k8, dk_, w.wk, kLinearK, kd, /*first=*/false));
  RETURN_IF_ERROR(linear(dh_, dv_, a.h1, w.wv, kLinearV, c, kd, /*first=*/false));
  Timed(kElementwise, [&] {  // dx16_ = dx in bf16 too, for the layer below
    RmsNormBackward(dx, G(w.attn_norm), dh_, a.x_in, N(w.attn_norm), a.rstd1, n, c, scratch_, stream_, dx16_);
    return 0;
  });
  dx16_holds_ = dx;
  return absl::OkStatus();
}

}  // namespace tierd::trainer::gpu
