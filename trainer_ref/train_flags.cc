#include "trainer_ref/train_flags.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/units.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/model_config_file.h"
#include "trainer_ref/schedule.h"

namespace tierd::trainer {
namespace {

// The flags named on the command line (this absl keeps IsSpecifiedOnCommandLine private).
std::set<std::string>& GivenFlags() {
  static std::set<std::string> given;
  return given;
}

bool Given(const char* name) { return GivenFlags().count(name) > 0; }

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::Status ReadPrecisionAndOptimizer(bool gpu) {
  const std::string precision = absl::AsciiStrToLower(absl::GetFlag(FLAGS_precision));
  if (precision == "fp8" && !gpu) {
    return Bad("--precision=fp8 is the GPU trainer's (FP8 tensor cores); the CPU reference is fp32");
  }
  if (precision != "auto" && precision != "fp32" && precision != "bf16" && precision != "fp8") {
    return Bad("--precision is auto, fp32 (CPU), bf16 or fp8 (GPU), not '" + precision + "'");
  }
  if (precision == "fp32" && gpu) {
    return Bad(
        "--precision=fp32: the GPU trainer computes bf16 with fp32 master weights, gradients and "
        "accumulation (--precision=auto); fp32 throughout is the CPU's (--device=cpu)");
  }
  if (precision == "bf16" && !gpu) return Bad("--precision=bf16 is the GPU trainer's; the CPU reference is fp32");
  const std::string opt = absl::AsciiStrToLower(absl::GetFlag(FLAGS_opt));
  if (opt != "adamw" && opt != "adamw8bit" && opt != "adamw_8bit" && opt != "lion" && opt != "adafactor") {
    return Bad("--opt is adamw, adamw8bit, lion or adafactor, not '" + absl::GetFlag(FLAGS_opt) + "'");
  }
  return absl::OkStatus();
}

absl::Status ReadCheckpointing(RunSettings& s) {
  const std::string value = absl::AsciiStrToLower(absl::GetFlag(FLAGS_grad_checkpointing));
  if (value == "none" || value == "false" || value == "0" || value == "no") return absl::OkStatus();
  s.checkpointing = true;
  if (value == "full" || value == "true" || value == "1" || value == "yes") return absl::OkStatus();
  if (value == "dynamic") {
    if (!s.gpu) {
      return Bad(
          "--grad_checkpointing=dynamic chooses under a GPU's memory (--device=gpu); the CPU trainer takes "
          "none or full");
    }
    s.dynamic_checkpointing = true;
    return absl::OkStatus();
  }
  return Bad("--grad_checkpointing is none, full or dynamic, not '" + value + "'");
}

absl::Status ReadCheckpointPrecision(RunSettings& s) {
  const std::string value = absl::AsciiStrToLower(absl::GetFlag(FLAGS_checkpoint_precision));
  if (value != "fp32" && value != "bf16") return Bad("--checkpoint_precision is fp32 or bf16, not '" + value + "'");
  s.bf16_checkpoints = value == "bf16";
  if (s.bf16_checkpoints && !s.checkpointing) {
    return Bad("--checkpoint_precision=bf16 rounds the inputs that --grad_checkpointing keeps: it needs it");
  }
  if (s.bf16_checkpoints && !s.gpu) return Bad("--checkpoint_precision=bf16 is for the GPU trainer (--device=gpu)");
  return absl::OkStatus();
}

absl::Status ReadDataParallel(RunSettings& s) {
  s.zero = absl::GetFlag(FLAGS_zero);
  if (s.zero != 0 && s.zero != 2 && s.zero != 3) {
    return Bad(
        absl::StrFormat("--zero is 0 (each rank keeps the whole state), 2 (optimizer state and gradients "
                        "sharded) or 3 (the parameters too), not %d",
                        s.zero));
  }
  s.sparse_ratio = absl::GetFlag(FLAGS_sparse_grad_ratio);
  s.sync_every = absl::GetFlag(FLAGS_sync_every);
  s.sparse_warmup = absl::GetFlag(FLAGS_sparse_warmup);
  const std::string sparse_sync = absl::GetFlag(FLAGS_sparse_sync);
  if (sparse_sync != "gradient" && sparse_sync != "update" && sparse_sync != "momentum") {
    return Bad("--sparse_sync is gradient, update or momentum, not '" + sparse_sync + "'");
  }
  s.sparse_update = sparse_sync == "update";
  s.sparse_momentum = sparse_sync == "momentum";
  if (s.sparse_warmup < 0) return Bad("--sparse_warmup: steps, 0 or more");
  s.comm_timeout = absl::GetFlag(FLAGS_comm_timeout);
  if (!(s.comm_timeout > 0)) return Bad("--comm_timeout: seconds, more than 0");
  const std::string by = absl::GetFlag(FLAGS_sparse_grad_ratio_by);
  for (absl::string_view part : absl::StrSplit(by, ',', absl::SkipEmpty())) {
    const size_t eq = part.rfind('=');
    double ratio = 0;
    if (eq == absl::string_view::npos || eq == 0 || !absl::SimpleAtod(part.substr(eq + 1), &ratio)) {
      return Bad(absl::StrFormat("--sparse_grad_ratio_by: '%s' is not REGEX=FRACTION", part));
    }
    s.sparse_ratio_by.emplace_back(std::string(part.substr(0, eq)), ratio);
  }
  return absl::OkStatus();
}

absl::Status ReadTierd(bool gpu, RunSettings& s) {
  const std::string policy = absl::GetFlag(FLAGS_offload_policy);
  if (policy != "none" && policy != "tierd" && policy != "tiered") {
    return Bad("--offload_policy is none or tierd, not '" + policy + "'");
  }
  s.tierd = policy != "none";
  s.tierd_dir = absl::GetFlag(FLAGS_tierd_dir);
  // On a GPU an empty --tierd_dram is sized from the model's state when the home is made (0 here).
  const std::string dram =
      absl::GetFlag(FLAGS_tierd_dram).empty() ? (gpu ? "0" : "64MiB") : absl::GetFlag(FLAGS_tierd_dram);
  const std::string nvme =
      absl::GetFlag(FLAGS_tierd_nvme).empty() ? (gpu ? "64GiB" : "1GiB") : absl::GetFlag(FLAGS_tierd_nvme);
  auto dram_bytes = ParseBytes(dram);
  auto nvme_bytes = ParseBytes(nvme);
  if (!dram_bytes.ok() || !nvme_bytes.ok()) return Bad("--tierd_dram / --tierd_nvme: sizes like 64MiB or 24GiB");
  s.tierd_dram = *dram_bytes;
  s.tierd_nvme = *nvme_bytes;
  return absl::OkStatus();
}

}  // namespace

void ParseTrainerFlags(int argc, char** argv, const char* usage) {
  absl::FlagsUsageConfig config;  // --help lists the trainer's flags, all defined in train_flag_defs.cc
  config.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "/train_flag_defs.cc"); };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    for (size_t k = 2; k < a.size() && a[k] != '='; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
    if (a == "--grad_checkpointing") a += "=full";  // was a switch: keep it one
    if (a == "--nograd_checkpointing") a = "--grad_checkpointing=none";
    const std::string name = a.substr(2, a.find('=') - 2);
    GivenFlags().insert(name);
    if (name.rfind("no", 0) == 0) GivenFlags().insert(name.substr(2));
  }
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  absl::ParseCommandLine(argc, pointers.data());
}

absl::StatusOr<ModelConfig> ReadModelFlags(std::string* init_from) {
  ShapeOverrides shape;
  shape.layers = absl::GetFlag(FLAGS_num_hidden_layers);
  shape.d_model = absl::GetFlag(FLAGS_hidden_size);
  shape.heads = absl::GetFlag(FLAGS_num_attention_heads);
  shape.kv_heads = absl::GetFlag(FLAGS_num_key_value_heads);
  shape.head_dim = absl::GetFlag(FLAGS_head_dim);
  shape.d_ff = absl::GetFlag(FLAGS_intermediate_size);
  shape.vocab = absl::GetFlag(FLAGS_vocab_size);
  shape.max_seq = absl::GetFlag(FLAGS_max_position_embeddings);
  if (Given("model_size") && !absl::GetFlag(FLAGS_model_config).empty()) {
    return Bad("give --model_size (a preset) or --model_config (a file), not both");
  }
  std::string from = absl::GetFlag(FLAGS_init_from);
  while (from.size() > 1 && from.back() == '/') from.pop_back();
  if (!from.empty()) {
    for (const char* flag : {"model_size", "model_config", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                             "max_position_embeddings"}) {
      if (Given(flag)) {
        return Bad(absl::StrFormat("--init_from takes the model's shape from %s/config.json: give no --%s",
                                   from, flag));
      }
    }
  }
  auto config = from.empty()
                    ? ResolveModelConfig(absl::GetFlag(FLAGS_model_size), absl::GetFlag(FLAGS_model_config), shape)
                    : ModelConfigFromFile(from + "/config.json");
  if (!config.ok()) return config.status();
  ModelConfig out = *config;
  if (!from.empty()) out.name = from.substr(from.find_last_of('/') + 1);
  *init_from = from;
  return out;
}

absl::StatusOr<RunSettings> ReadRunSettings(bool gpu, std::vector<std::string>* notes) {
  RunSettings s;
  s.gpu = gpu;
  s.given = GivenFlags();
  if (absl::Status st = ReadPrecisionAndOptimizer(gpu); !st.ok()) return st;
  const std::string opt = absl::AsciiStrToLower(absl::GetFlag(FLAGS_opt));
  s.lion = opt == "lion";
  s.adafactor = opt == "adafactor";
  s.moments_8bit = opt == "adamw8bit" || opt == "adamw_8bit";
  s.moments_8bit_min = absl::GetFlag(FLAGS_adamw8bit_min_size);
  if (s.moments_8bit_min < 0) return Bad("--adamw8bit_min_size: 0 (every tensor 8-bit) or a count of values");
  if (Given("adamw8bit_min_size") && s.moments_8bit_min > 0 && !s.moments_8bit)
    return Bad("--adamw8bit_min_size goes with --opt=adamw8bit");
  if (!s.moments_8bit) s.moments_8bit_min = 0;
  const std::string precision = absl::AsciiStrToLower(absl::GetFlag(FLAGS_precision));
  s.fp8 = precision == "fp8";
  s.precision_auto = gpu && precision == "auto";
  s.bf16_layers = absl::GetFlag(FLAGS_bf16_layers);
  if (!s.bf16_layers.empty() && !s.fp8 && !s.precision_auto)
    return Bad("--bf16_layers chooses layers to keep out of FP8: give it with --precision=fp8 or auto (GPU)");
  const std::string scaling = absl::AsciiStrToLower(absl::GetFlag(FLAGS_fp8_scaling));
  if (scaling != "delayed" && scaling != "current" && scaling != "fixed") {
    return Bad("--fp8_scaling is delayed, current or fixed, not '" + scaling + "'");
  }
  s.fp8_delayed = scaling == "delayed";
  if ((Given("fp8_fixed_scale") || Given("fp8_fixed_grad_scale")) && scaling != "fixed") {
    return Bad("--fp8_fixed_scale and --fp8_fixed_grad_scale go with --fp8_scaling=fixed");
  }
  if (scaling == "fixed") {
    const double scale = absl::GetFlag(FLAGS_fp8_fixed_scale), grad = absl::GetFlag(FLAGS_fp8_fixed_grad_scale);
    const auto good = [](double x) { return x >= 0x1p-100 && x <= 0x1p100; };  // finite in fp32 both ways
    if (!good(scale) || !good(grad)) {
      return Bad(absl::StrFormat(
          "--fp8_fixed_scale and --fp8_fixed_grad_scale are positive scales between 2^-100 and 2^100 (got %g and %g)",
          scale, grad));
    }
    s.fp8_fixed_scale = static_cast<float>(scale);
    s.fp8_fixed_grad_scale = static_cast<float>(grad);
  }
  s.fp8_window = absl::GetFlag(FLAGS_fp8_window);
  s.fp8_margin = absl::GetFlag(FLAGS_fp8_margin);
  s.fp8_fast_accumulation = absl::GetFlag(FLAGS_fp8_fast_accumulation);
  s.fp8_fallback_after = absl::GetFlag(FLAGS_fp8_fallback_after);
  if (s.fp8_window < 1 || s.fp8_window > 1024) return Bad("--fp8_window is 1..1024 steps");
  if (s.fp8_margin < 0 || s.fp8_margin > 32) return Bad("--fp8_margin is 0..32 (a power of two of headroom)");
  if (s.fp8_fallback_after < 0) return Bad("--fp8_fallback_after is a count of steps (0: never fall back)");
  auto config = ReadModelFlags(&s.init_from);
  if (!config.ok()) return config.status();
  s.config = *config;
  s.export_dir = absl::GetFlag(FLAGS_export);
  s.validation_out = absl::GetFlag(FLAGS_validation_out);
  const std::string export_dtype = absl::AsciiStrToLower(absl::GetFlag(FLAGS_export_dtype));
  if (export_dtype != "bf16" && export_dtype != "fp32") return Bad("--export_dtype is bf16 or fp32");
  s.export_fp32 = export_dtype == "fp32";
  auto shard = ParseBytes(absl::GetFlag(FLAGS_export_shard_size));
  if (!shard.ok() || *shard < (uint64_t{1} << 20)) return Bad("--export_shard_size is a size of at least 1MiB (5GiB)");
  s.export_shard_bytes = *shard;
  if (!s.export_dir.empty()) {
    if (absl::Status st = hf::CheckExportDir(s.export_dir); !st.ok()) return st;
  }
  s.data = absl::GetFlag(FLAGS_data);
  s.batch = absl::GetFlag(FLAGS_batch_size) != 0 ? absl::GetFlag(FLAGS_batch_size) : (gpu ? 8 : 4);
  const int seq_flag = absl::GetFlag(FLAGS_seq_len);
  s.seq = seq_flag != 0 ? seq_flag : std::min(s.config.max_seq, gpu ? 2048 : 64);
  s.accum = absl::GetFlag(FLAGS_grad_accum_steps);
  s.steps = absl::GetFlag(FLAGS_steps) != 0 ? absl::GetFlag(FLAGS_steps) : (gpu ? 50 : 200);
  // Lion's updates are the sign's, a size for every element: a third of AdamW's rate by default.
  const Schedule schedule = ChooseSchedule(s.config, s.steps, !s.init_from.empty(), gpu, opt == "lion",
                                           absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_warmup));
  s.lr = schedule.lr;
  s.warmup = schedule.warmup;
  s.schedule_note = schedule.why;
  s.clip = absl::GetFlag(FLAGS_clip);
  s.loss_spike_sds = absl::GetFlag(FLAGS_loss_spike_sds);
  if (!(s.loss_spike_sds >= 0) || !std::isfinite(s.loss_spike_sds)) {
    return Bad("--loss_spike_sds is a number of standard deviations, 0 or more (0: no spike guard)");
  }
  s.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  s.seed = absl::GetFlag(FLAGS_seed);
  s.data_seed = absl::GetFlag(FLAGS_data_seed) != 0 ? absl::GetFlag(FLAGS_data_seed) : s.seed;
  if (s.batch < 1 || s.seq < 1 || s.accum < 1 || s.steps < 1 ||
      (Given("batch_size") && s.batch != absl::GetFlag(FLAGS_batch_size)) ||
      (Given("steps") && s.steps != absl::GetFlag(FLAGS_steps))) {
    return Bad("--batch_size, --seq_len, --grad_accum_steps and --steps must be at least 1");
  }
  if (s.seq > s.config.max_seq) {
    return Bad(absl::StrFormat("--seq_len %d is longer than model %s's %d (max_position_embeddings)", s.seq,
                               s.config.name, s.config.max_seq));
  }
  if (s.config.sliding_window > 0 && s.seq > s.config.sliding_window) {
    return Bad(absl::StrFormat("--seq_len %d is longer than model %s's sliding window of %d positions; attention here "
                               "is full causal attention, which equals the window's only for sequences within it",
                               s.seq, s.config.name, s.config.sliding_window));
  }
  if (!(s.lr > 0) || (Given("lr") && !(absl::GetFlag(FLAGS_lr) > 0)) || s.clip < 0 || s.weight_decay < 0 ||
      s.warmup < 0 || (Given("warmup") && absl::GetFlag(FLAGS_warmup) < 0)) {
    return Bad("--lr must be positive; --clip, --weight_decay and --warmup not negative");
  }
  if (absl::Status st = ReadCheckpointing(s); !st.ok()) return st;
  if (absl::Status st = ReadCheckpointPrecision(s); !st.ok()) return st;
  if (absl::Status st = ReadTierd(gpu, s); !st.ok()) return st;
  if (absl::Status st = ReadDataParallel(s); !st.ok()) return st;
  s.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  s.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  s.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  s.resume = absl::GetFlag(FLAGS_resume);
  if (s.resume && s.checkpoint_dir.empty()) return Bad("--resume needs --checkpoint_dir");
  if (s.checkpoint_every < 1 || s.checkpoint_keep < 1)
    return Bad("--checkpoint_every and --checkpoint_keep: at least 1");
  s.metrics = absl::GetFlag(FLAGS_metrics);
  s.plot = absl::GetFlag(FLAGS_plot);
  s.compare_metrics = absl::GetFlag(FLAGS_compare_metrics);
  s.eval_every = absl::GetFlag(FLAGS_eval_every);
  if (!s.validation_out.empty() && s.eval_every < 0) return Bad("--validation_out needs a validation (--eval_every >= 0)");
  s.tierd_plan = absl::GetFlag(FLAGS_tierd_plan);
  s.tierd_record = absl::GetFlag(FLAGS_tierd_record);
  s.gpu_budget_text = absl::GetFlag(FLAGS_gpu_budget);
  if (auto budget = ParseBytes(s.gpu_budget_text); budget.ok()) {
    s.gpu_budget = *budget;
  } else if (gpu && s.tierd) {
    return Bad("--gpu_budget: a size like 24GiB");
  }
  s.optimizer_place = absl::GetFlag(FLAGS_optimizer_place);
  s.optimizer_deferred = absl::GetFlag(FLAGS_optimizer_deferred);
  s.fp8_weight_codes = absl::GetFlag(FLAGS_fp8_weight_codes);
  s.fp8_transposed_weight_codes = absl::GetFlag(FLAGS_fp8_transposed_weight_codes);
  s.compact_state = absl::GetFlag(FLAGS_compact_state);
  s.step_order = absl::GetFlag(FLAGS_step_order);
  s.optimizer_chunks = absl::GetFlag(FLAGS_optimizer_chunks);
  s.attention = absl::GetFlag(FLAGS_attention);
  s.fused_norms = absl::GetFlag(FLAGS_fused_norms);
  s.optimizer_one_launch = absl::GetFlag(FLAGS_optimizer_one_launch);
  if (s.attention != "auto" && s.attention != "cudnn" && s.attention != "cudnn-fast" && s.attention != "ours") {
    return Bad("--attention is auto, cudnn, cudnn-fast or ours, not '" + s.attention + "'");
  }
  s.gemm_candidates = absl::GetFlag(FLAGS_gemm_candidates);
  s.gemm_workspace_mib = absl::GetFlag(FLAGS_gemm_workspace_mib);
  if (s.gemm_workspace_mib < 0 || s.gemm_workspace_mib > 1024) {
    return Bad(absl::StrFormat("--gemm_workspace_mib=%d: 0 (algorithms without one) up to 1024", s.gemm_workspace_mib));
  }
  if (s.gemm_candidates < 1 || s.gemm_candidates > 64) {
    return Bad(absl::StrFormat("--gemm_candidates=%d: 1 (cuBLASLt's heuristic first choice) up to 64",
                               s.gemm_candidates));
  }
  s.gemm_cache_dir = absl::GetFlag(FLAGS_gemm_cache_dir);
  if (s.gemm_cache_dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    s.gemm_cache_dir = xdg != nullptr && *xdg != 0 ? std::string(xdg) + "/tierd"
                       : home != nullptr           ? std::string(home) + "/.cache/tierd"
                                                   : "/tmp/tierd-cache";
  }
  s.pcie_gbps = absl::GetFlag(FLAGS_pcie_gbps);
  s.nvme_gbps = absl::GetFlag(FLAGS_nvme_gbps);
  s.gpu_tflops = absl::GetFlag(FLAGS_gpu_tflops);
  s.profile = absl::GetFlag(FLAGS_profile);
  s.timing_skip = absl::GetFlag(FLAGS_timing_skip);
  const std::vector<const char*> gpu_only = {
      "gpu_budget",         "optimizer_place", "pcie_gbps",   "nvme_gbps",  "gpu_tflops",    "optimizer_chunks",
      "optimizer_deferred", "profile",         "timing_skip", "step_order", "compact_state", "adamw8bit_min_size",
      "gemm_candidates",    "gemm_cache_dir",  "attention",   "gemm_workspace_mib"};
  // (The GPU trainer's ranks sync dense: with more than one it refuses the sparse and ZeRO flags.)
  const std::vector<const char*> cpu_only = {"tierd_record",         "zero",           "sparse_grad_ratio",
                                             "sparse_grad_ratio_by", "sync_every",     "sparse_warmup",
                                             "sparse_sync",          "compare_metrics"};
  for (const char* name : gpu ? cpu_only : gpu_only) {
    if (Given(name) && notes != nullptr) {
      notes->push_back(absl::StrFormat("--%s is for the %s trainer: ignored on the %s", name, gpu ? "CPU" : "GPU",
                                       gpu ? "GPU" : "CPU"));
    }
  }
  return s;
}

DeviceFlags ReadDeviceFlags() { return {absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_print_device)}; }

absl::StatusOr<ExportFlags> ReadExportFlags() {
  ExportFlags f;
  f.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  f.to = absl::GetFlag(FLAGS_to);
  if (f.checkpoint.empty() || f.to.empty()) {
    return absl::InvalidArgumentError(
        "give --checkpoint=FILE_OR_DIR --to=NEW_DIR and the run's model flags (--init_from=DIR, or --model_size / "
        "--model_config)");
  }
  const std::string dtype = absl::GetFlag(FLAGS_export_dtype);
  if (dtype != "bf16" && dtype != "fp32") return absl::InvalidArgumentError("--export_dtype is bf16 or fp32");
  f.fp32 = dtype == "fp32";
  auto shard = ParseBytes(absl::GetFlag(FLAGS_export_shard_size));
  if (!shard.ok()) return absl::InvalidArgumentError("--export_shard_size: " + std::string(shard.status().message()));
  f.shard_bytes = *shard;
  return f;
}

}  // namespace tierd::trainer
