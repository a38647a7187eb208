#include "tools/kernel_profile/kernel_name.h"

#include <string>

#include "gtest/gtest.h"

namespace tierd::tools {
namespace {

// A template kernel of the trainer's: return type, namespaces and parameters go, the template
// arguments stay (they tell the variants apart).
TEST(KernelNameTest, DropsTheParametersAndTheTrainersNamespaces) {
  // void tierd::trainer::gpu::(anonymous namespace)::AdamW8bitKernel<float, true, false>(float*, int)
  EXPECT_EQ(ReadableKernelName("_ZN5tierd7trainer3gpu12_GLOBAL__N_115AdamW8bitKernelIfLb1ELb0EEEvPfi"),
            "AdamW8bitKernel<float, true, false>");
  // void tierd::trainer::gpu::Fill(float*, long)
  EXPECT_EQ(ReadableKernelName("_ZN5tierd7trainer3gpu4FillEPfl"), "Fill");
}

TEST(KernelNameTest, KeepsNamesThatDoNotDemangleAndCutsLongOnes) {
  EXPECT_EQ(ReadableKernelName("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128"),
            "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128");
  const std::string name = ReadableKernelName(std::string(300, 'k').c_str());
  EXPECT_EQ(name.size(), 100u);
  EXPECT_EQ(name.substr(97), "...");
}

}  // namespace
}  // namespace tierd::tools
