// Where the optimizer step should run when the optimizer state does not all fit on the GPU:
// streamed through the GPU (the master weights and moments come in and go back out each
// step) or on the host next to the data in DRAM (the gradients come down, the new bf16
// weights go up, the host's threads do the arithmetic, overlapping the next forward). A
// cost model of what each place adds to a step, from the sizes, the tiers' budgets, the
// links and the host's measured AdamW rate.
#ifndef TIERD_TRAINER_REF_OPTIMIZER_PLACE_H_
#define TIERD_TRAINER_REF_OPTIMIZER_PLACE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tierd::trainer {

struct OptimizerCostInputs {
  double params = 0;                // parameters stepped
  double state_bytes = 0;           // everything the GPU side would hold (weights, master,
                                    // gradients, moments, saved activations)
  double gpu_bytes = 0;             // the GPU memory for it (tierd's quota)
  double dram_bytes = 0;            // tierd's DRAM quota (0: unbounded)
  double h2d_bytes_per_s = 55e9;    // host -> GPU
  double d2h_bytes_per_s = 55e9;    // GPU -> host
  double nvme_bytes_per_s = 2e9;    // reads and writes sharing the device
  double host_params_per_s = 1e9;   // HostAdamW, measured (Calibrate)
  const char* host_optimizer = "AdamW";  // its name, for the line that explains the choice
  double gpu_params_per_s = 1e11;   // the GPU kernel: ~30 B a parameter at a few TB/s
  double forward_seconds = 0;       // the first micro-batch's forward: what the host step overlaps
  bool gpu_overlaps_forward = false;  // the GPU's update deferred to the next forward (streams meanwhile)
  double moment_bytes_per_param = 8;  // both moments: fp32 8, 8-bit blockwise ~2
  double activation_bytes = 0;        // the saved activations (in state_bytes too): on the host
                                      // path they share DRAM with the state beyond the GPU's quota
};

struct OptimizerChoice {
  bool on_cpu = false;
  double gpu_seconds = 0, cpu_seconds = 0;  // the model's estimate of what each adds to a step
  double offloaded_fraction = 0;            // of master + moments that cannot stay on the GPU
  double gpu_nvme_bytes = 0, cpu_nvme_bytes = 0;  // what spills to NVMe each step, each way
  std::string why;                          // one line, with the numbers
};

// GPU: the offloaded fraction f of master + moments (4 B + the moments a parameter) comes
// in and goes out, both directions at once (less the forward it overlaps when deferred),
// plus the kernel; what fits neither the GPU nor
// DRAM goes through NVMe both ways. CPU: gradients down (4 B), weights up (2 B), the host's
// arithmetic less the forward it overlaps, and the NVMe round trip of what DRAM cannot
// hold of the host's state (master, moments, gradients, weights: 10 B + the moments a
// parameter) and the activations the GPU's quota cannot: the slowest of these. The smaller
// estimate wins.
OptimizerChoice ChooseOptimizerPlace(const OptimizerCostInputs& in);

// --optimizer_place=split: how many of the last groups (in forward order, each with its
// master weights' and moments' bytes) the host steps so that the GPU keeps the rest: the
// fewest whose bytes add up to `excess`, what the state exceeds the GPU's quota by; all of
// them when they do not; 0 when nothing exceeds it. The last groups, because the host's
// update of a group must be done before that group's next forward: those come last.
int HostGroupsForSplit(const std::vector<double>& group_optimizer_bytes, double excess);

// HostAdamW's rate on this host: parameters a second over `elements` (best of two runs).
double CalibrateHostAdamW(int64_t elements = int64_t{1} << 23, bool moments_8bit = false);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_OPTIMIZER_PLACE_H_
