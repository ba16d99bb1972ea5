"""BUILD content for `@torchlens_system`: Debian's libraries under /usr.

Headers in /usr/include are on the compiler's default path and inside the toolchain's
builtin include directories, so only LibTorch's C++ frontend directory is added; its
headers are declared so that sandboxed compiles see them.
"""

SYSTEM_LIBS_BUILD = """
package(default_visibility = ["//visibility:public"])

# libtorch-dev 1.13.1 (CPU only).
cc_library(
    name = "libtorch",
    hdrs = glob(["include/torch/csrc/api/include/**/*.h"]),
    includes = ["include/torch/csrc/api/include"],
    linkopts = ["-ltorch", "-ltorch_cpu", "-lc10", "-pthread"],
)

# python3-dev (3.11) and libtorch-dev's Python bindings: for the torchlens_cpp extension
# module (torchlens_dispatch/python), which Debian's /usr/bin/python3 loads beside
# python3-torch. Extensions take Python's own symbols from the interpreter: no -lpython.
cc_library(
    name = "python",
    hdrs = glob(["include/python3.11/**/*.h"]),
    includes = ["include/python3.11"],
)

cc_library(
    name = "torch_python",
    linkopts = ["-ltorch_python"],
    deps = [":libtorch", ":python"],
)

# libabsl-dev 20220623: one target for the components torchlens uses.
cc_library(
    name = "absl",
    linkopts = [
        "-labsl_statusor", "-labsl_status", "-labsl_strerror",
        "-labsl_flags_parse", "-labsl_flags_usage", "-labsl_flags_usage_internal",
        "-labsl_flags_internal", "-labsl_flags_marshalling", "-labsl_flags_reflection",
        "-labsl_flags_private_handle_accessor", "-labsl_flags_commandlineflag",
        "-labsl_flags_commandlineflag_internal", "-labsl_flags_config",
        "-labsl_flags_program_name", "-labsl_str_format_internal",
        "-labsl_cord", "-labsl_cordz_info", "-labsl_cord_internal",
        "-labsl_cordz_functions", "-labsl_cordz_handle",
        "-labsl_raw_hash_set", "-labsl_hashtablez_sampler", "-labsl_exponential_biased",
        "-labsl_synchronization", "-labsl_graphcycles_internal", "-labsl_stacktrace",
        "-labsl_symbolize", "-labsl_debugging_internal", "-labsl_demangle_internal",
        "-labsl_malloc_internal", "-labsl_time", "-labsl_civil_time", "-labsl_time_zone",
        "-labsl_hash", "-labsl_city", "-labsl_low_level_hash", "-labsl_strings",
        "-labsl_strings_internal", "-labsl_throw_delegate", "-labsl_bad_optional_access",
        "-labsl_bad_variant_access", "-labsl_base", "-labsl_raw_logging_internal",
        "-labsl_log_severity", "-labsl_spinlock_wait", "-labsl_int128", "-lrt",
    ],
)

# libgtest-dev / libgmock-dev 1.12.1 (static archives).
cc_library(
    name = "gtest",
    linkopts = ["-lgmock", "-lgtest", "-pthread"],
)

cc_library(
    name = "gtest_main",
    linkopts = ["-lgmock", "-lgtest_main", "-lgtest", "-pthread"],
)

# libgraphviz-dev: in-process layout and rendering.
cc_library(
    name = "graphviz",
    linkopts = ["-lgvc", "-lcgraph"],
)

# zlib1g-dev: inflating the deflated records of TorchScript archives before LibTorch
# reads them (graph/zip_archive.h).
cc_library(
    name = "zlib",
    linkopts = ["-lz"],
)

# nlohmann-json3-dev: header only.
cc_library(name = "nlohmann_json")
"""
