#include "prefetcher/synthetic.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tierd::prefetcher {

double TransformerShape::Params() const {
  const double per_layer = 4.0 * d_model * d_model + 3.0 * d_model * d_ff;
  return layers * per_layer + 2.0 * vocab * d_model;
}

absl::StatusOr<TransformerShape> ShapePreset(const std::string& name) {
  if (name == "tiny") return TransformerShape{name, 4, 256, 688, 256};
  if (name == "1.3b") return TransformerShape{name, 24, 2048, 5504, 32000};
  if (name == "7b") return TransformerShape{name, 32, 4096, 11008, 32000};
  if (name == "13b") return TransformerShape{name, 40, 5120, 13824, 32000};
  return absl::InvalidArgumentError(absl::StrFormat("unknown model '%s'; use tiny, 1.3b, 7b or 13b", name));
}

Graph SyntheticTransformer(const TransformerShape& s, const TraceOptions& o) {
  Graph g;
  auto add = [&](const std::string& name, double bytes) {
    g.tensors.push_back({name, static_cast<uint64_t>(bytes), false});
    return static_cast<TensorIndex>(g.tensors.size() - 1);
  };
  struct Group {
    std::string name;
    double params;
    TensorIndex w, grad;
    std::vector<TensorIndex> state;  // master, m, v; in sub-groups when asked
  };
  const int chunks = std::max(1, o.optimizer_state_chunks);
  auto group = [&](const std::string& name, double params) {
    Group gr{name, params, 0, 0, {}};
    gr.w = add(name + ".w", 2 * params);
    gr.grad = add(name + ".grad", 2 * params);
    for (const char* kind : {"master", "m", "v"}) {
      for (int c = 0; c < chunks; ++c) {
        const std::string suffix = chunks > 1 ? absl::StrFormat(".%d", c) : "";
        gr.state.push_back(add(absl::StrFormat("opt.%s.%s%s", kind, name, suffix), 4 * params / chunks));
      }
    }
    return gr;
  };
  const double tokens = static_cast<double>(o.micro_batch_seqs) * o.seq_len;
  const double act_bytes = tokens * s.d_model * 2;
  Group embed = group("embed", 1.0 * s.vocab * s.d_model);
  std::vector<Group> layers;
  for (int l = 0; l < s.layers; ++l) {
    layers.push_back(group(absl::StrFormat("layers.%d", l), 4.0 * s.d_model * s.d_model + 3.0 * s.d_model * s.d_ff));
  }
  Group head = group("head", 1.0 * s.vocab * s.d_model);
  std::vector<TensorIndex> act;
  for (int l = 0; l <= s.layers; ++l) act.push_back(add(absl::StrFormat("act.%d", l), act_bytes));
  const TensorIndex dact[2] = {add("dact.0", act_bytes), add("dact.1", act_bytes)};
  // What one layer's forward keeps alive while it runs (q, k, v, attention out, MLP).
  const TensorIndex work = add("workspace", tokens * (6.0 * s.d_model + 3.0 * s.d_ff) * 2);

  const double layer_fwd = (2 * tokens * layers[0].params + 2 * o.micro_batch_seqs * double(o.seq_len) * o.seq_len * s.d_model) / o.flops_per_s;
  const double head_fwd = 2 * tokens * head.params / o.flops_per_s;
  const double embed_time = 2 * act_bytes / o.hbm_bytes_per_s;
  for (int mb = 0; mb < o.grad_accum; ++mb) {
    auto grad_use = [&](GraphOp& op, TensorIndex grad) {
      (mb == 0 ? op.overwrites : op.writes).push_back(grad);  // the first micro-batch sets them
    };
    const std::string tag = o.grad_accum > 1 ? absl::StrFormat("mb%d.", mb) : "";
    g.ops.push_back({tag + "embed.fwd", {embed.w}, {}, embed_time, {act[0]}});
    for (int l = 0; l < s.layers; ++l) {
      g.ops.push_back({tag + absl::StrFormat("layers.%d.fwd", l), {layers[l].w, act[l]}, {}, layer_fwd, {act[l + 1], work}});
    }
    GraphOp loss{tag + "head.fwd_bwd", {head.w, act[s.layers]}, {}, 3 * head_fwd, {dact[0], work}};
    grad_use(loss, head.grad);
    g.ops.push_back(loss);
    int cur = 0;
    for (int l = s.layers; l-- > 0;) {
      // Backward recomputes the layer's forward from its checkpoint, then twice its FLOPs.
      GraphOp bwd{tag + absl::StrFormat("layers.%d.bwd", l), {layers[l].w, act[l], dact[cur]}, {}, 3 * layer_fwd,
                  {dact[1 - cur], work}};
      grad_use(bwd, layers[l].grad);
      g.ops.push_back(bwd);
      cur = 1 - cur;
    }
    GraphOp ebwd{tag + "embed.bwd", {dact[cur]}, {}, embed_time, {}};
    grad_use(ebwd, embed.grad);
    g.ops.push_back(ebwd);
  }
  auto adam = [&](const Group& gr) {
    if (o.optimizer_on_host) {
      GraphOp op{gr.name + ".adamw.cpu", {}, {}, gr.params / o.host_adamw_params_per_s, {}};
      op.host_reads = {gr.grad};
      op.host_writes = gr.state;
      op.host_overwrites = {gr.w};
      g.ops.push_back(op);
      return;
    }
    const double seconds = 28 * gr.params / o.hbm_bytes_per_s;  // read grad, rw master/m/v, write w
    g.ops.push_back({gr.name + ".adamw", {gr.grad}, gr.state, seconds, {gr.w}});
  };
  adam(embed);
  for (const Group& gr : layers) adam(gr);
  adam(head);
  return g;
}

}  // namespace tierd::prefetcher
