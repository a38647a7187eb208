#include "trainer_ref/hf/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace tierd::trainer::hf {
namespace {

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name + "." + std::to_string(getpid());
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(SafetensorsTest, WrittenFilesReadBackInEveryDtype) {
  const std::string path = TempPath("rt.safetensors");
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> a(6 * 5), b(7);
  for (float& x : a) x = normal(rng);
  for (float& x : b) x = normal(rng);
  std::vector<TensorInfo> infos(2);
  infos[0].name = "a";
  infos[0].dtype = Dtype::kF32;
  infos[0].shape = {6, 5};
  infos[1].name = "b.bias";
  infos[1].dtype = Dtype::kBF16;
  infos[1].shape = {7};
  auto w = SafetensorsWriter::Create(path, infos, {{"format", "pt"}});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Write(a.data(), 16).ok());  // any split
  ASSERT_TRUE((*w)->Write(reinterpret_cast<const char*>(a.data()) + 16, a.size() * 4 - 16).ok());
  std::vector<uint16_t> b16;
  for (float x : b) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    b16.push_back(static_cast<uint16_t>(bits >> 16));  // truncated: any bf16 bits read back exactly
  }
  ASSERT_TRUE((*w)->Write(b16.data(), b16.size() * 2).ok());
  EXPECT_NE(access((path + ".partial").c_str(), F_OK), -1) << "written aside first";
  EXPECT_EQ(access(path.c_str(), F_OK), -1);
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_EQ(access((path + ".partial").c_str(), F_OK), -1);
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const TensorInfo* ta = (*f)->Find("a");
  const TensorInfo* tb = (*f)->Find("b.bias");
  ASSERT_TRUE(ta != nullptr && tb != nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{6, 5}));
  std::vector<float> ra(30), rb(7), part(4);
  (*f)->ReadFloats(*ta, 0, 30, ra.data());
  (*f)->ReadFloats(*tb, 0, 7, rb.data());
  (*f)->ReadFloats(*ta, 11, 4, part.data());
  EXPECT_EQ(ra, a);
  for (int i = 0; i < 7; ++i) {
    uint32_t bits = static_cast<uint32_t>(b16[i]) << 16;
    float want;
    std::memcpy(&want, &bits, 4);
    EXPECT_EQ(rb[i], want);
  }
  EXPECT_EQ(part, std::vector<float>(a.begin() + 11, a.begin() + 15));
  // The header is padded so that the data starts 8 bytes aligned in the file (as the format's own writer does).
  const std::string file = Slurp(path);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | static_cast<unsigned char>(file[i]);
  EXPECT_EQ((8 + header) % 8, 0u);
  EXPECT_EQ(file.size(), 8 + header + 30 * 4 + 7 * 2);
  unlink(path.c_str());
}

TEST(SafetensorsTest, HalfFloatsConvertExactly) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.f, -24)) << "the smallest subnormal";
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.f, -24)) << "the largest subnormal";
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
}

// A cut file, a lying header length, a header that is not JSON, a tensor past the end, a dtype
// not read: each refused naming the file, with the byte offset for damage.
TEST(SafetensorsTest, DamagedFilesAreRefusedWithFileAndOffset) {
  const std::string good = TempPath("good.safetensors");
  std::vector<TensorInfo> infos(1);
  infos[0].name = "w";
  infos[0].dtype = Dtype::kF32;
  infos[0].shape = {4, 4};
  auto w = SafetensorsWriter::Create(good, infos);
  ASSERT_TRUE(w.ok());
  std::vector<float> zeros(16, 0.5f);
  ASSERT_TRUE((*w)->Write(zeros.data(), 64).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  const std::string bytes = Slurp(good);
  struct Case {
    std::string name, content, says;
    absl::StatusCode code;
  };
  std::string huge_length = bytes;
  huge_length[5] = 1;  // the header's length > the file
  std::string not_json = bytes;
  not_json[9] = '@';
  std::string f8 = bytes;
  const size_t dtype_at = f8.find("F32");
  f8.replace(dtype_at, 3, "I64");
  for (const Case& c : {Case{"cut", bytes.substr(0, bytes.size() - 5), "ends at byte 64 of the data, which has 59 (the file is cut)",
                             absl::StatusCode::kDataLoss},
                        Case{"tiny", bytes.substr(0, 5), "byte 5: the file has 5 bytes", absl::StatusCode::kDataLoss},
                        Case{"length", huge_length, "byte 0: the header's length says", absl::StatusCode::kDataLoss},
                        Case{"json", not_json, "byte 8: the header is not JSON (at byte 1:", absl::StatusCode::kDataLoss},
                        Case{"dtype", f8, "tensor 'w' is I64; BF16, F16 and F32 are read",
                             absl::StatusCode::kInvalidArgument}}) {
    const std::string path = TempPath(c.name + ".safetensors");
    std::ofstream(path, std::ios::binary) << c.content;
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << c.name;
    EXPECT_EQ(f.status().code(), c.code) << f.status();
    EXPECT_NE(f.status().message().find(path), absl::string_view::npos) << f.status();
    EXPECT_NE(f.status().message().find(c.says), absl::string_view::npos) << f.status();
    unlink(path.c_str());
  }
  EXPECT_EQ(SafetensorsFile::Open(TempPath("absent")).status().code(), absl::StatusCode::kNotFound);
  unlink(good.c_str());
}

TEST(SafetensorsTest, AnUnfinishedWriterLeavesNothing) {
  const std::string path = TempPath("unfinished.safetensors");
  std::vector<TensorInfo> infos(1);
  infos[0].name = "w";
  infos[0].shape = {8};
  {
    auto w = SafetensorsWriter::Create(path, infos);
    ASSERT_TRUE(w.ok());
    float x[4] = {1, 2, 3, 4};
    ASSERT_TRUE((*w)->Write(x, sizeof(x)).ok());
    EXPECT_EQ((*w)->Finish().code(), absl::StatusCode::kInternal) << "16 of 32 bytes";
    EXPECT_EQ((*w)->Write(x, 64).code(), absl::StatusCode::kInternal) << "past the header's bytes";
  }
  EXPECT_EQ(access(path.c_str(), F_OK), -1);
  EXPECT_EQ(access((path + ".partial").c_str(), F_OK), -1);
}

}  // namespace
}  // namespace tierd::trainer::hf
