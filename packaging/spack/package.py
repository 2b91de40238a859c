# package.py: Spack recipe for mgrl. Put it in a Spack repository as packages/mgrl/package.py:
#   spack repo create myrepo && cp package.py myrepo/packages/mgrl/ && spack repo add myrepo
#   spack install mgrl +cuda cuda_arch=70      (V100: CUDA 12.x; CUDA 13 cannot build for sm_70)
#   spack install mgrl ~cuda                   (the CPU backend only)
# Its dependencies are those CMakeLists.txt looks for with find_package / pkg_check_modules (a test,
# packaging.spack_dependencies, compares the two).
from spack.package import *


class Mgrl(CMakePackage, CudaPackage):
    """LoRA fine-tuning (SFT, GRPO) of Llama / Qwen language models, data-parallel over MPI ranks,
    one rank per GPU; a CPU backend (fp32) runs anywhere."""

    homepage = "https://github.com/mgrl/mgrl"
    git = "https://github.com/mgrl/mgrl.git"

    maintainers("mgrl")
    license("MIT")

    version("main", branch="main")
    version("0.1.0", tag="v0.1.0")

    # CudaPackage adds the variants cuda and cuda_arch (and depends_on("cuda", when="+cuda")).
    conflicts("cuda_arch=none", when="+cuda", msg="give the GPU architectures: cuda_arch=70, 80, 90 ...")
    conflicts("^cuda@13:", when="+cuda cuda_arch=70", msg="CUDA 13 cannot build for sm_70 (V100): use CUDA 12")

    depends_on("cxx", type="build")
    depends_on("c", type="build")
    depends_on("cmake@3.24:", type="build")
    depends_on("ninja", type="build")
    depends_on("pkgconfig", type="build")

    depends_on("mpi")
    depends_on("hdf5@1.10:+mpi+cxx")  # the MPI-parallel HDF5, C and C++ APIs
    depends_on("boost@1.71:+program_options")
    depends_on("tomlplusplus")
    depends_on("nlohmann-json@3.9:")
    depends_on("pcre2")
    depends_on("utf8proc")
    # BLAS for the CPU backend: OpenBLAS itself (a blas provider), because mgrl calls openblas_set_num_threads.
    depends_on("openblas")
    depends_on("nccl", when="+cuda")

    generator("ninja")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("MGRL_CUDA", "ON" if spec.satisfies("+cuda") else "OFF"),
            self.define("MGRL_BUILD_TESTS", False),
            self.define("MGRL_BUILD_BENCH", False),
            self.define("HDF5_PREFER_PARALLEL", True),
            self.define("BLA_VENDOR", "OpenBLAS"),
        ]
        if spec.satisfies("+cuda"):
            archs = spec.variants["cuda_arch"].value
            args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs)))
            args.append(self.define("NCCL_ROOT", spec["nccl"].prefix))
        return args
