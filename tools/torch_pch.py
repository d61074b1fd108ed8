"""torch's C++ headers precompiled once for the extension's host sources (GCC only), for setup.py.

Parsing <ATen/ATen.h> and <torch/library.h> is most of the compile time of a source that includes them: 14 s
of a 14 s compile at -O3, 5 s with the header precompiled. Every host source of the extension gets them in front
(`-include`), from one precompiled header made with exactly the flags ninja compiles the sources with; a source
that includes them again gets nothing new (include guards), one that never did pays about a second for loading
the header. The objects do not depend on whether GCC found the precompiled header or parsed the text.

Skipped (the sources compile as they are) for a compiler other than GCC, when the header cannot be used with
these flags, and with SPCONV_NO_PCH=1.
"""
import hashlib
import inspect
import os
import shlex
import subprocess

PCH_INCLUDES = ("ATen/ATen.h", "torch/library.h")
PCH_TEXT = "".join("#include <%s>\n" % h for h in PCH_INCLUDES)


def is_gcc(compiler):
    """Does `compiler` read GCC's precompiled headers (GCC itself, not clang behind a g++ name)?"""
    try:
        macros = subprocess.run([compiler, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                                text=True).stdout
    except OSError:
        return False
    return "#define __GNUC__" in macros and "__clang__" not in macros


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def make(compiler, before, after, directory, log=print):
    """Precompiles PCH_TEXT for a compile command `compiler <before> -c SRC -o OBJ <after>`; returns the flags
    that make a source use it (['-include', header]), or [] where it cannot be used. Kept under directory in a
    folder keyed by the compiler, the flags and the torch headers' location, so a changed flag makes a new one."""
    if os.environ.get("SPCONV_NO_PCH") == "1" or not is_gcc(compiler):
        return []
    version = _run([compiler, "--version"]).stdout
    key = hashlib.sha256("\0".join([version, PCH_TEXT] + before + ["|"] + after).encode()).hexdigest()[:16]
    header = os.path.join(directory, "pch-" + key, "spconv_torch_pch.h")
    if not os.path.isfile(header + ".gch"):
        os.makedirs(os.path.dirname(header), exist_ok=True)
        with open(header, "w") as f:
            f.write(PCH_TEXT)
        tmp = "%s.gch.tmp%d" % (header, os.getpid())
        r = _run([compiler] + before + ["-x", "c++-header", "-c", header, "-o", tmp] + after)
        if r.returncode != 0:
            log("spconv: no precompiled torch header (%s)" % r.stderr.strip().splitlines()[-1:])
            return []
        os.replace(tmp, header + ".gch")
    # A header GCC refuses for these flags would be parsed as text in every source: ten seconds more for
    # those that never included torch. Ask GCC once whether it takes it.
    probe = _run([compiler] + before + ["-include", header, "-Winvalid-pch", "-fsyntax-only", "-x", "c++",
                                        os.devnull] + after)
    if probe.returncode != 0 or "not used because" in probe.stderr:
        log("spconv: the precompiled torch header is not usable with these flags; compiling without it")
        return []
    return ["-include", header]


def with_torch_pch(base):
    """A BuildExtension subclass whose ninja compiles get the precompiled torch header."""
    import torch.utils.cpp_extension as cpp_extension

    class BuildExtWithTorchPch(base):
        def build_extensions(self):
            write_and_compile = cpp_extension._write_ninja_file_and_compile_objects

            def with_pch(*args, **kwargs):
                call = inspect.signature(write_and_compile).bind(*args, **kwargs)
                a = call.arguments
                # ninja's compile rule: $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
                before = shlex.split(" ".join(a["cflags"]))
                after = shlex.split(" ".join(a["post_cflags"]))
                extra = make(cpp_extension.get_cxx_compiler(), before, after, a["build_directory"])
                a["post_cflags"] = list(a["post_cflags"]) + [shlex.quote(f) for f in extra]
                return write_and_compile(*call.args, **call.kwargs)

            cpp_extension._write_ninja_file_and_compile_objects = with_pch
            try:
                super().build_extensions()
            finally:
                cpp_extension._write_ninja_file_and_compile_objects = write_and_compile

    return BuildExtWithTorchPch
