#include "trainer_ref/run_plan.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/hf/json.h"
#include "trainer_ref/model_config.h"

namespace tierd::trainer {

void RunPlan::Add(std::string setting, std::string value, std::string source) {
  rows.push_back({std::move(setting), std::move(value), std::move(source)});
}

std::string RunPlan::Table() const {
  size_t setting = 0, value = 0;
  for (const Row& row : rows) {
    setting = std::max(setting, row.setting.size());
    value = std::max(value, row.value.size());
  }
  value = std::min<size_t>(value, 60);  // a long value does not push every source off the screen
  std::string out = "run plan:\n";
  for (const Row& row : rows) {
    out += absl::StrFormat("  %-*s  %-*s  %s\n", static_cast<int>(setting), row.setting, static_cast<int>(value),
                           row.value, row.source);
  }
  return out;
}

std::string RunPlan::JsonLine() const {
  std::string out = "{\"plan\": {";
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) out += ", ";
    out += hf::JsonQuote(rows[i].setting) + ": " + hf::JsonQuote(rows[i].value);
  }
  return out + "}}\n";
}

void AddCommonRows(const RunSettings& s, RunPlan* plan) {
  // "--a, --b" for the flags given among `flags`, "default" for none.
  auto from = [&](std::initializer_list<const char*> flags) {
    std::string given;
    for (const char* flag : flags) {
      if (s.Given(flag)) given += (given.empty() ? "--" : ", --") + std::string(flag);
    }
    if (given.empty()) return std::string("default");
    return given + (flags.size() > 1 && given.find(',') == std::string::npos ? " (the rest default)" : "");
  };
  const std::string model_source = !s.init_from.empty()           ? "--init_from's config.json"
                                   : s.Given("model_config")      ? "--model_config"
                                   : s.Given("model_size")        ? "--model_size"
                                                                  : "default";
  plan->Add("model", DescribeConfig(s.config), model_source);
  plan->Add("weights", s.init_from.empty() ? absl::StrFormat("initialised, seed %d", s.seed) : s.init_from,
            s.init_from.empty() ? from({"seed"}) : "--init_from");
  plan->Add("tokens a step",
            absl::StrFormat("%d x %d x %d micro-batches = %d", s.batch, s.seq, s.accum,
                            int64_t{s.batch} * s.seq * s.accum),
            from({"batch_size", "seq_len", "grad_accum_steps"}));
  plan->Add("steps", absl::StrFormat("%d, warmup %d", s.steps, s.warmup),
            from({"steps", "warmup"}));
  plan->Add("learning rate", absl::StrFormat("%g, clip %g, weight decay %g", s.lr, s.clip, s.weight_decay),
            from({"lr", "clip", "weight_decay"}));
  plan->Add("data", s.data, from({"data"}));
  const std::string opt = s.lion        ? "Lion"
                          : s.adafactor ? "Adafactor"
                          : s.moments_8bit
                              ? (s.moments_8bit_min > 0
                                     ? absl::StrFormat("AdamW, 8-bit moments (fp32 under %d values)", s.moments_8bit_min)
                                     : std::string("AdamW, 8-bit moments"))
                              : "AdamW";
  plan->Add("optimizer", opt, from({"opt", "adamw8bit_min_size"}));
  plan->Add("offload", s.tierd ? "tierd at " + s.tierd_dir : "none (plain buffers)", from({"offload_policy"}));
  plan->Add("checkpoints",
            s.checkpoint_dir.empty()
                ? std::string("none")
                : absl::StrFormat("every %d steps in %s, keep %d", s.checkpoint_every, s.checkpoint_dir,
                                  s.checkpoint_keep),
            from({"checkpoint_dir", "checkpoint_every", "checkpoint_keep"}));
  if (!s.export_dir.empty()) {
    plan->Add("export", absl::StrFormat("%s (%s, shards of %s)", s.export_dir, s.export_fp32 ? "fp32" : "bf16",
                                        FormatBytes(s.export_shard_bytes)),
              "--export");
  }
}

}  // namespace tierd::trainer
