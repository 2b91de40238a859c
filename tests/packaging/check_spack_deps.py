#!/usr/bin/env python3
"""check_spack_deps.py: the Spack recipe (packaging/spack/package.py) depends on what CMakeLists.txt looks for.

Every find_package / pkg_check_modules of the top-level CMakeLists.txt must have its Spack package among the
recipe's depends_on (CUDAToolkit and NCCL only when +cuda), and every library the recipe depends on must be looked
for by CMake. Parses the recipe with ast: Spack itself is not needed.
    check_spack_deps.py CMakeLists.txt package.py
"""
import ast
import re
import sys

# CMake package (or pkg-config module) -> Spack package. None: nothing to depend on (or tests/benchmarks only,
# which the recipe turns off).
CMAKE_TO_SPACK = {
    "MPI": "mpi",
    "HDF5": "hdf5",
    "Boost": "boost",
    "tomlplusplus": "tomlplusplus",
    "nlohmann_json": "nlohmann-json",
    "BLAS": "openblas",  # BLA_VENDOR OpenBLAS: mgrl calls openblas_set_num_threads
    "CUDAToolkit": "cuda",
    "NCCL": "nccl",
    "PkgConfig": "pkgconfig",
    "libpcre2-8": "pcre2",
    "libutf8proc": "utf8proc",
    "Threads": None,
    "Git": None,
    "GTest": None,  # MGRL_BUILD_TESTS, off in the recipe
    "benchmark": None,  # MGRL_BUILD_BENCH, off in the recipe
}
CUDA_ONLY = {"CUDAToolkit", "NCCL"}
BUILD_TOOLS = {"cmake", "ninja", "c", "cxx", "pkgconfig"}


def cmake_packages(text):
    text = re.sub(r"#[^\n]*", "", text)
    found = {m.group(1) for m in re.finditer(r"find_package\(\s*([A-Za-z0-9_]+)", text)}
    for m in re.finditer(r"pkg_check_modules\(([^)]*)\)", text):
        found |= {w for w in m.group(1).split() if w.startswith("lib")}
    return found


def recipe_dependencies(text):
    deps = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "depends_on" and node.args:
            spec = node.args[0].value
            name = re.match(r"[A-Za-z0-9_-]+", spec).group(0)
            when = next((k.value.value for k in node.keywords if k.arg == "when"), "")
            deps[name] = (spec, when)
    return deps


def main():
    cmake = cmake_packages(open(sys.argv[1]).read())
    recipe_text = open(sys.argv[2]).read()
    deps = recipe_dependencies(recipe_text)
    errors = []
    for pkg in sorted(cmake):
        if pkg not in CMAKE_TO_SPACK:
            errors.append(f"CMakeLists.txt looks for {pkg}: add it to the recipe and to this test's table")
            continue
        spack = CMAKE_TO_SPACK[pkg]
        if spack is None:
            print(f"  {pkg:14s} -> (not a dependency)")
            continue
        if spack == "cuda":  # CudaPackage adds depends_on("cuda", when="+cuda")
            ok = "CudaPackage" in recipe_text
            print(f"  {pkg:14s} -> cuda (from CudaPackage: {'yes' if ok else 'no'})")
            if not ok:
                errors.append("the recipe does not derive from CudaPackage (variants cuda, cuda_arch)")
            continue
        if spack not in deps:
            errors.append(f"CMakeLists.txt looks for {pkg}, the recipe has no depends_on('{spack}')")
            continue
        spec, when = deps[spack]
        print(f"  {pkg:14s} -> depends_on('{spec}'" + (f", when='{when}'" if when else "") + ")")
        if pkg in CUDA_ONLY and "+cuda" not in when:
            errors.append(f"{spack} must be a dependency only when +cuda")
        if pkg == "HDF5" and "+mpi" not in spec:
            errors.append("hdf5 must be the MPI-parallel one (+mpi)")
    wanted = {v for v in CMAKE_TO_SPACK.values() if v} | BUILD_TOOLS
    for name in sorted(set(deps) - wanted):
        errors.append(f"the recipe depends on {name}, which CMakeLists.txt does not look for")
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"spack recipe: {len(deps)} dependencies match the {len(cmake)} packages CMakeLists.txt looks for")
    return 0


if __name__ == "__main__":
    sys.exit(main())
