// The reference trainer's one set of flags, for either device (tierd-train picks the GPU when
// there is a usable one, the CPU reference otherwise). Flags take dashes or underscores.
// Settings whose sensible value differs by device (batch, steps, learning rate, quotas) default
// to 0 / "" here and are resolved by ReadRunSettings for the device chosen.
#ifndef TIERD_TRAINER_REF_TRAIN_FLAGS_H_
#define TIERD_TRAINER_REF_TRAIN_FLAGS_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "trainer_ref/model_config.h"

ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(bool, print_device);
ABSL_DECLARE_FLAG(std::string, model_size);
ABSL_DECLARE_FLAG(std::string, model_config);
ABSL_DECLARE_FLAG(int, hidden_size);
ABSL_DECLARE_FLAG(int, num_hidden_layers);
ABSL_DECLARE_FLAG(int, num_attention_heads);
ABSL_DECLARE_FLAG(int, num_key_value_heads);
ABSL_DECLARE_FLAG(int, head_dim);
ABSL_DECLARE_FLAG(int, intermediate_size);
ABSL_DECLARE_FLAG(int, vocab_size);
ABSL_DECLARE_FLAG(int, max_position_embeddings);
ABSL_DECLARE_FLAG(std::string, data);
ABSL_DECLARE_FLAG(std::string, init_from);
ABSL_DECLARE_FLAG(std::string, export);
ABSL_DECLARE_FLAG(std::string, export_dtype);
ABSL_DECLARE_FLAG(std::string, export_shard_size);
ABSL_DECLARE_FLAG(int, batch_size);
ABSL_DECLARE_FLAG(int, seq_len);
ABSL_DECLARE_FLAG(int, grad_accum_steps);
ABSL_DECLARE_FLAG(int64_t, steps);
ABSL_DECLARE_FLAG(int64_t, warmup);
ABSL_DECLARE_FLAG(double, lr);
ABSL_DECLARE_FLAG(double, clip);
ABSL_DECLARE_FLAG(double, weight_decay);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(uint64_t, data_seed);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(std::string, bf16_layers);
ABSL_DECLARE_FLAG(std::string, fp8_scaling);
ABSL_DECLARE_FLAG(int32_t, fp8_window);
ABSL_DECLARE_FLAG(int32_t, fp8_margin);
ABSL_DECLARE_FLAG(bool, fp8_fast_accumulation);
ABSL_DECLARE_FLAG(int32_t, fp8_fallback_after);
ABSL_DECLARE_FLAG(std::string, opt);
ABSL_DECLARE_FLAG(std::string, grad_checkpointing);
ABSL_DECLARE_FLAG(std::string, checkpoint_precision);
ABSL_DECLARE_FLAG(std::string, offload_policy);
ABSL_DECLARE_FLAG(std::string, tierd_dir);
ABSL_DECLARE_FLAG(std::string, tierd_dram);
ABSL_DECLARE_FLAG(std::string, tierd_nvme);
ABSL_DECLARE_FLAG(bool, tierd_plan);
ABSL_DECLARE_FLAG(bool, tierd_record);
ABSL_DECLARE_FLAG(std::string, checkpoint_dir);
ABSL_DECLARE_FLAG(int64_t, checkpoint_every);
ABSL_DECLARE_FLAG(int, checkpoint_keep);
ABSL_DECLARE_FLAG(bool, resume);
ABSL_DECLARE_FLAG(std::string, metrics);
ABSL_DECLARE_FLAG(std::string, plot);
ABSL_DECLARE_FLAG(int64_t, eval_every);
// The GPU trainer's own.
ABSL_DECLARE_FLAG(std::string, gpu_budget);
ABSL_DECLARE_FLAG(std::string, optimizer_place);
ABSL_DECLARE_FLAG(bool, fp8_weight_codes);
ABSL_DECLARE_FLAG(bool, fp8_transposed_weight_codes);
ABSL_DECLARE_FLAG(std::string, compact_state);
ABSL_DECLARE_FLAG(double, pcie_gbps);
ABSL_DECLARE_FLAG(double, nvme_gbps);
ABSL_DECLARE_FLAG(double, gpu_tflops);
ABSL_DECLARE_FLAG(int, optimizer_chunks);
ABSL_DECLARE_FLAG(std::string, attention);
ABSL_DECLARE_FLAG(bool, fused_norms);
ABSL_DECLARE_FLAG(bool, optimizer_one_launch);
ABSL_DECLARE_FLAG(int, gemm_candidates);
ABSL_DECLARE_FLAG(int, gemm_workspace_mib);
ABSL_DECLARE_FLAG(std::string, gemm_cache_dir);
ABSL_DECLARE_FLAG(bool, optimizer_deferred);
ABSL_DECLARE_FLAG(std::string, step_order);
ABSL_DECLARE_FLAG(bool, profile);
ABSL_DECLARE_FLAG(int64_t, timing_skip);
ABSL_DECLARE_FLAG(std::string, checkpoint);
ABSL_DECLARE_FLAG(std::string, to);
ABSL_DECLARE_FLAG(std::string, validation_out);
ABSL_DECLARE_FLAG(double, loss_spike_sds);
ABSL_DECLARE_FLAG(double, fp8_fixed_scale);
ABSL_DECLARE_FLAG(double, fp8_fixed_grad_scale);
ABSL_DECLARE_FLAG(int64_t, adamw8bit_min_size);
ABSL_DECLARE_FLAG(std::string, compare_metrics);
ABSL_DECLARE_FLAG(int, zero);
ABSL_DECLARE_FLAG(double, sparse_grad_ratio);
ABSL_DECLARE_FLAG(std::string, sparse_grad_ratio_by);
ABSL_DECLARE_FLAG(std::string, sparse_sync);
ABSL_DECLARE_FLAG(int, sparse_warmup);
ABSL_DECLARE_FLAG(int, sync_every);
ABSL_DECLARE_FLAG(double, comm_timeout);

namespace tierd::trainer {

// Parses the command line (after turning dashes in flag names into underscores and a bare
// --grad_checkpointing into =full), with --help listing these flags. Exits on a parse error
// as absl does.
void ParseTrainerFlags(int argc, char** argv, const char* usage);

// What both trainers read, resolved for a device and checked.
struct RunSettings {
  bool gpu = false;
  std::set<std::string> given;  // the flags the command line named (underscored)
  bool Given(const std::string& flag) const { return given.count(flag) > 0; }
  ModelConfig config;
  std::string init_from;   // --init_from: a Hugging Face checkpoint directory ("": initialised by seed)
  std::string export_dir;  // --export ("": none)
  bool export_fp32 = false;
  uint64_t export_shard_bytes = uint64_t{5} << 30;
  std::string validation_out;  // --validation_out ("": none)
  std::string schedule_note;  // the learning-rate schedule and why (ChooseSchedule)
  std::string data;
  int batch = 0, seq = 0, accum = 1;
  int64_t steps = 0, warmup = 0;
  double lr = 0, clip = 1.0, weight_decay = 0.1;
  double loss_spike_sds = 4.0;  // --loss_spike_sds (0: off)
  uint64_t seed = 1;
  uint64_t data_seed = 1;  // --data_seed, or --seed's
  bool checkpointing = false;
  bool bf16_checkpoints = false;       // --checkpoint_precision=bf16
  bool dynamic_checkpointing = false;  // with checkpointing: the layers that fit keep theirs (GPU)
  bool moments_8bit = false;  // --opt=adamw8bit
  int64_t moments_8bit_min = 0;  // --adamw8bit_min_size (GPU trainer; 0 without --opt=adamw8bit)
  bool lion = false;          // --opt=lion
  bool adafactor = false;     // --opt=adafactor (GPU)
  bool fp8 = false;           // --precision=fp8: the layers' matmuls in FP8 (GPU)
  bool precision_auto = false;  // --precision=auto on a GPU: FP8 where the GPU and the shapes allow it
  std::string bf16_layers;    // --bf16_layers: those layers' matmuls stay bf16
  bool fp8_delayed = true;    // --fp8_scaling
  // --fp8_scaling=fixed: --fp8_fixed_scale (E4M3 tensors) and --fp8_fixed_grad_scale (E5M2); 0 otherwise.
  float fp8_fixed_scale = 0, fp8_fixed_grad_scale = 0;
  int fp8_window = 16, fp8_margin = 0;
  bool fp8_fast_accumulation = false;  // the forward's FP8 GEMMs
  int fp8_fallback_after = 4;  // 0: never
  bool tierd = false;         // --offload_policy=tierd
  std::string tierd_dir;
  uint64_t tierd_dram = 0, tierd_nvme = 0;  // tierd_dram 0 (GPU): sized from the state
  std::string checkpoint_dir;
  int64_t checkpoint_every = 50;
  int checkpoint_keep = 2;
  bool resume = false;
  std::string metrics, plot;
  std::string compare_metrics;  // another run's metrics, drawn and compared
  int64_t eval_every = 50;
  // Data parallelism (the ranks come from the launcher's environment).
  int zero = 0;             // 0 or 2
  double sparse_ratio = 0;  // 0: dense
  std::vector<std::pair<std::string, double>> sparse_ratio_by;
  int sync_every = 1;
  int sparse_warmup = 0;
  bool sparse_update = false;    // --sparse_sync=update
  bool sparse_momentum = false;  // --sparse_sync=momentum
  double comm_timeout = 120;   // seconds
  // tierd's planner (--tierd_plan: register the step's graph; --tierd_record: CPU, record it).
  bool tierd_plan = true, tierd_record = false;
  // The GPU trainer's own, as given: "auto" here is resolved by the GPU run (gpu/gpu_run_state.h),
  // which says each choice and why.
  uint64_t gpu_budget = 0;      // --gpu_budget in bytes (0: not a size, refused where tierd needs one)
  std::string gpu_budget_text;  // as written
  std::string optimizer_place = "auto";  // gpu | cpu | auto
  bool optimizer_deferred = true;
  bool fp8_weight_codes = false;
  bool fp8_transposed_weight_codes = true;  // with fp8_weight_codes, micro order, > 1 micro-batch
  std::string compact_state = "auto";    // on | off | auto
  std::string step_order = "auto";       // micro | layer | auto
  int optimizer_chunks = 1;
  std::string attention = "auto";  // --attention: auto | cudnn | ours
  bool fused_norms = true;          // --fused_norms
  bool optimizer_one_launch = true;  // --optimizer_one_launch
  int gemm_candidates = 1;     // --gemm_candidates
  int gemm_workspace_mib = 32;  // --gemm_workspace_mib
  std::string gemm_cache_dir;  // --gemm_cache_dir, or its default resolved
  double pcie_gbps = 55, nvme_gbps = 2, gpu_tflops = 300;  // the cost models' machine
  bool profile = false;
  int64_t timing_skip = 2;
};

// The model's shape from the flags: --init_from's config.json, or a preset or --model_config
// with single dimensions overridden. `init_from`: --init_from ("" without it).
absl::StatusOr<ModelConfig> ReadModelFlags(std::string* init_from);

// INVALID_ARGUMENT saying which flag and what it takes. `notes` gets one line per flag given
// that the device ignores. The only reader of the trainer's flags besides the two below.
absl::StatusOr<RunSettings> ReadRunSettings(bool gpu, std::vector<std::string>* notes);

// --device (auto | gpu | cpu) and --print_device, for the choice of trainer before its settings.
struct DeviceFlags {
  std::string device;
  bool print_device = false;
};
DeviceFlags ReadDeviceFlags();

// `tierd-train export`'s own: --checkpoint, --to, --export_dtype, --export_shard_size.
struct ExportFlags {
  std::string checkpoint, to;
  bool fp32 = false;
  uint64_t shard_bytes = 0;
};
absl::StatusOr<ExportFlags> ReadExportFlags();

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TRAIN_FLAGS_H_
