// ChooseDevice (worker/lm/device_choice.h): every row of the device rules, with the CUDA facts of machines we do not
// have.
#include "worker/lm/device_choice.h"

#include <gtest/gtest.h>

namespace diloco {
namespace {

const CudaFacts kCpuBuild{false, 0};
const CudaFacts kCudaBuildNoGpu{true, 0};
const CudaFacts kFourGpus{true, 4};

TEST(DeviceChoiceTest, CpuIsCpuEverywhere) {
  for (const CudaFacts& facts : {kCpuBuild, kCudaBuildNoGpu, kFourGpus}) {
    auto c = ChooseDevice("cpu", "workers.device", 3, 4, facts);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->device, "cpu");
    EXPECT_EQ(c->warning, "");
  }
}

TEST(DeviceChoiceTest, CudaGivesEachLocalRankItsOwnGpu) {
  for (int rank = 0; rank < 4; ++rank) {
    auto c = ChooseDevice("cuda", "workers.device", rank, 4, kFourGpus);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->device, "cuda:" + std::to_string(rank));
    EXPECT_EQ(c->warning, "");
  }
}

TEST(DeviceChoiceTest, PinnedGpuIsKeptAndSharingItInAClusterIsSaid) {
  auto alone = ChooseDevice("cuda:2", "workers.device", 0, 1, kFourGpus);
  ASSERT_TRUE(alone.ok());
  EXPECT_EQ(alone->device, "cuda:2");
  EXPECT_EQ(alone->warning, "");
  auto shared = ChooseDevice("cuda:0", "workers.device", 1, 2, kFourGpus);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->device, "cuda:0");
  EXPECT_NE(shared->warning.find("one GPU"), std::string::npos) << shared->warning;
  EXPECT_NE(shared->warning.find("workers.device"), std::string::npos) << shared->warning;
}

TEST(DeviceChoiceTest, MissingCudaIsOneLineNamingTheKeyAndWhatIsAvailable) {
  auto cpu_build = ChooseDevice("cuda", "workers.device", 0, 1, kCpuBuild);
  ASSERT_FALSE(cpu_build.ok());
  EXPECT_EQ(std::string(cpu_build.status().message()).find('\n'), std::string::npos);
  EXPECT_NE(cpu_build.status().message().find("workers.device"), std::string::npos);
  EXPECT_NE(cpu_build.status().message().find("no CUDA"), std::string::npos) << cpu_build.status();
  EXPECT_NE(cpu_build.status().message().find("available: cpu"), std::string::npos);

  auto no_gpu = ChooseDevice("cuda:0", "--device", 0, 1, kCudaBuildNoGpu);
  ASSERT_FALSE(no_gpu.ok());
  EXPECT_NE(no_gpu.status().message().find("--device: 'cuda:0'"), std::string::npos) << no_gpu.status();
  EXPECT_NE(no_gpu.status().message().find("no CUDA device"), std::string::npos) << no_gpu.status();

  auto past = ChooseDevice("cuda:4", "workers.device", 0, 1, kFourGpus);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.status().message().find("4 CUDA devices (cuda:0..cuda:3)"), std::string::npos) << past.status();

  auto rank_past = ChooseDevice("cuda", "workers.device", 5, 6, kFourGpus);
  ASSERT_FALSE(rank_past.ok());
  EXPECT_NE(rank_past.status().message().find("cuda:5 for local rank 5"), std::string::npos) << rank_past.status();
}

TEST(DeviceChoiceTest, NotADeviceIsRefused) {
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", ""}) {
    auto c = ChooseDevice(bad, "workers.device", 0, 1, kFourGpus);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("use cpu, cuda or cuda:N"), std::string::npos) << c.status();
  }
}

}  // namespace
}  // namespace diloco
