// What a run does, every choice resolved: one row per setting with its value and where the
// value came from (the flag as given, the default, or an automatic choice). Printed once as a
// table before the first step and written as the first line of --metrics, so a metrics file
// says what produced it.
#ifndef TIERD_TRAINER_REF_RUN_PLAN_H_
#define TIERD_TRAINER_REF_RUN_PLAN_H_

#include <string>
#include <vector>

#include "trainer_ref/train_flags.h"

namespace tierd::trainer {

struct RunPlan {
  struct Row {
    std::string setting, value, source;  // source: "--flag", "default", "auto", "--init_from", ...
  };
  std::vector<Row> rows;

  void Add(std::string setting, std::string value, std::string source);
  // "run plan:" and a row a line, columns aligned.
  std::string Table() const;
  // {"plan": {"setting": "value", ...}}: one line of --metrics (readers take lines with "step").
  std::string JsonLine() const;
};

// The rows both trainers share, from the settings: the model, the tokens of a step, the
// schedule, the data, the optimizer's kind, checkpoints and offload.
void AddCommonRows(const RunSettings& s, RunPlan* plan);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_RUN_PLAN_H_
