// ChooseDevice (worker/lm/device_choice.h): every row of the device rules, with the CUDA facts of machines we do not
// have; and the matmul precision a device gets (worker/lm/matmul_precision.h).
#include "worker/lm/device_choice.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "worker/lm/matmul_precision.h"

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
    EXPECT_EQ(c->why, "cpu (workers.device)");
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
  EXPECT_EQ(alone->why, "cuda:2 (workers.device 'cuda:2')");
  // An explicit GPU wins over the local rank, however large.
  auto far = ChooseDevice("cuda:1", "--device", 7, 1, kFourGpus);
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_EQ(far->device, "cuda:1");
  EXPECT_EQ(far->warning, "");
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
  EXPECT_NE(rank_past.status().message().find("fewer than the 6 ranks of this cluster"), std::string::npos)
      << rank_past.status();
}

// Single workers on one machine (diloco-launch's --local-rank = the worker's index): one GPU each while there are
// enough, then round robin, each past the GPU count told whom it shares with.
TEST(DeviceChoiceTest, SingleWorkersTakeTheirIndexModuloTheGpuCount) {
  const char* expected[] = {"cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1", "cuda:2"};
  for (int index = 0; index < 7; ++index) {
    auto c = ChooseDevice("cuda", "workers.device", index, 1, kFourGpus);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->device, expected[index]) << index;
    EXPECT_EQ(c->warning.empty(), index < 4) << c->warning;
  }
  auto fifth = ChooseDevice("cuda", "workers.device", 5, 1, kFourGpus);
  ASSERT_TRUE(fifth.ok());
  EXPECT_EQ(fifth->why, "cuda:1 (workers.device 'cuda': local rank 5 on a machine with 4 GPUs)");
  EXPECT_EQ(fifth->warning,
            "workers.device: local rank 5 shares cuda:1 with local rank 1: this machine has 4 GPUs for more processes");
  auto one_gpu = ChooseDevice("cuda", "workers.device", 3, 1, CudaFacts{true, 1});
  ASSERT_TRUE(one_gpu.ok());
  EXPECT_EQ(one_gpu->device, "cuda:0");
}

// Workers that are clusters of n <= GPUs ranks, numbered as diloco-launch numbers them (worker i's rank r has local
// rank i x n + r): the ranks of each cluster stay on distinct GPUs, also once the numbers wrap.
TEST(DeviceChoiceTest, ClusterRanksNumberedByTheLauncherNeverShareAGpu) {
  for (int n : {1, 2, 3, 4}) {
    for (int worker = 0; worker < 5; ++worker) {
      std::set<std::string> devices;
      for (int r = 0; r < n; ++r) {
        auto c = ChooseDevice("cuda", "workers.device", worker * n + r, n, kFourGpus);
        ASSERT_TRUE(c.ok()) << c.status();
        devices.insert(c->device);
      }
      EXPECT_EQ(devices.size(), static_cast<size_t>(n)) << "cluster of " << n << ", worker " << worker;
    }
  }
}

// workers.allow_tf32: TF32 ("high") only on a CUDA device and only when allowed; CPU workers keep full fp32.
TEST(DeviceChoiceTest, Tf32IsSetOnlyForCudaDevicesThatAllowIt) {
  EXPECT_EQ(ApplyMatmulPrecision("cuda:1", true), "high");
  EXPECT_EQ(at::globalContext().float32MatmulPrecision(), at::Float32MatmulPrecision::HIGH);
  EXPECT_EQ(ApplyMatmulPrecision("cuda", false), "highest");
  EXPECT_EQ(at::globalContext().float32MatmulPrecision(), at::Float32MatmulPrecision::HIGHEST);
  ApplyMatmulPrecision("cuda", true);
  EXPECT_EQ(ApplyMatmulPrecision("cpu", true), "highest");  // and a CPU worker resets what was there
  EXPECT_EQ(at::globalContext().float32MatmulPrecision(), at::Float32MatmulPrecision::HIGHEST);
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
