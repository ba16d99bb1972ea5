"""Repositories torchlens needs, all offline, over Debian's system packages.

Call `torchlens_deps()` from a WORKSPACE (torchlens' own or a consumer's that declares
torchlens as `local_repository(name = "torchlens", ...)`). Each repository is declared
only if the workspace has not declared one of that name already, so a monorepo that
brings its own `@platforms` or `@bazel_skylib` keeps them.

Why each one exists (Bazel 4.2.3 from Debian's `bazel-bootstrap`, no network):
  * `rules_cc`: Bazel 4.2.3 loads `@rules_cc//cc:defs.bzl`, normally fetched from the
    network; Debian's `bazel-rules-cc` is too new for 4.2.3. We write a forwarder to the
    native rules instead.
  * `remote_coverage_tools`: `bazel test` references it even without `--coverage`.
  * `platforms`, `bazel_skylib`, `rules_java`: Debian ships them under /usr/share/bazel.
  * `libtorch`, `absl`, `gtest`, `graphviz`, `nlohmann_json`, `zlib`: system libraries in
    /usr.
"""

load(":system_libs.bzl", "SYSTEM_LIBS_BUILD")

# Starlark in Bazel 4.2.3 has no nested functions: each forwarder is a top-level def.
_RULES_CC_DEFS = """
def cc_library(**kwargs):
    native.cc_library(**kwargs)

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)

def cc_test(**kwargs):
    native.cc_test(**kwargs)

def cc_import(**kwargs):
    native.cc_import(**kwargs)

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)

def objc_library(**kwargs):
    native.objc_library(**kwargs)
"""

def _rules_cc_stub_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "rules_cc")\n')
    rctx.file("BUILD", "")
    rctx.file("cc/BUILD", "")
    rctx.file("cc/defs.bzl", _RULES_CC_DEFS)

_rules_cc_stub = repository_rule(implementation = _rules_cc_stub_impl)

_COVERAGE_BUILD = """
package(default_visibility = ["//visibility:public"])

sh_binary(name = "coverage_report_generator", srcs = ["unavailable.sh"])

sh_binary(name = "lcov_merger", srcs = ["unavailable.sh"])
"""

def _coverage_stub_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "remote_coverage_tools")\n')
    rctx.file("BUILD", _COVERAGE_BUILD)
    rctx.file(
        "unavailable.sh",
        "#!/bin/sh\necho 'coverage tools are not available offline' >&2\nexit 1\n",
        executable = True,
    )

_coverage_stub = repository_rule(implementation = _coverage_stub_impl)

def _declare(name, rule, **kwargs):
    if name not in native.existing_rules():
        rule(name = name, **kwargs)

def torchlens_deps():
    """Declares every repository torchlens needs unless already declared."""
    _declare("rules_cc", _rules_cc_stub)
    _declare("remote_coverage_tools", _coverage_stub)
    _declare("platforms", native.local_repository, path = "/usr/share/bazel/tools/platforms")
    _declare("bazel_skylib", native.local_repository, path = "/usr/share/bazel/tools/skylib")
    _declare("rules_java", native.local_repository, path = "/usr/share/bazel/rules/java")
    _declare(
        "torchlens_system",
        native.new_local_repository,
        path = "/usr",
        build_file_content = SYSTEM_LIBS_BUILD,
    )
