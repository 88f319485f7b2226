"""llama.cpp's `llama-server` as a bench peer, built here, and the bench model as GGUF.

`--build-llama-server` (scripts/bench.py) builds it once into `.cache/llama.cpp/`: the
llama-cpp-python source package on PyPI vendors llama.cpp (`vendor/llama.cpp`), and cmake
builds only the `llama-server` target, without curl, OpenSSL or the web UI (about 13 minutes
on 2 cores). The model is converted with the vendored `convert_hf_to_gguf.py` (`gguf-py` from
the same tree, `sentencepiece` installed on the way). The tiny models' byte-level BPE is not in
the converter's table of known pre-tokenizers, which it matches by hashing a test string's
tokens; the GPT-2 pre-tokenizer is what they use, so the converter is told so. Not part of
`make test`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
# The builds a bench may ask for (`--llama-build`), each in a folder of its own. `native` is
# -march=native, AMX included where the CPU advertises it; `avx512` names the AVX-512 extensions
# and leaves AMX out: on an Intel VM that advertises AMX, native's llama-server dies (SIGSEGV or
# SIGILL) loading a Q8_0 model, which its AMX path repacks, and the AVX-512 build serves it.
BUILDS: dict[str, tuple[str, ...]] = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx512": (
        "-DGGML_NATIVE=OFF",
        *(f"-DGGML_{ext}=ON" for ext in ("AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512", "AVX512_VBMI")),
        *(f"-DGGML_{ext}=ON" for ext in ("AVX512_VNNI", "AVX512_BF16")),
        *(f"-DGGML_{ext}=OFF" for ext in ("AMX_TILE", "AMX_INT8", "AMX_BF16")),
    ),
}
# Runs the vendored converter with the pre-tokenizer answered: argv[1] is the llama.cpp tree.
_CONVERT = """
import runpy, sys
tree = sys.argv[1]
sys.path[:0] = [tree + "/gguf-py", tree]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
sys.argv = [tree + "/convert_hf_to_gguf.py", *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _run(argv: list[str], what: str, **kwargs: object) -> None:
    print(f"llama.cpp: {what}", flush=True)
    subprocess.run(argv, check=True, **kwargs)  # type: ignore[call-overload]


def source_tree(cache_dir: Path) -> Path:
    """The vendored llama.cpp tree, downloaded and unpacked once."""
    tree = next(cache_dir.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if tree is not None:
        return tree
    cache_dir.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", LLAMA_CPP_PYTHON, "--no-binary", ":all:", "--no-deps"]
    _run([*pip, "-d", str(cache_dir)], f"downloading the {LLAMA_CPP_PYTHON} source package")
    archive = next(cache_dir.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(cache_dir, filter="data")
    return next(cache_dir.glob("llama_cpp_python-*/vendor/llama.cpp"))


def ensure_llama_server(cache_dir: Path, build: str = "native") -> Path:
    """The llama-server binary of `build` (BUILDS), built on first use."""
    return ensure_llama_tool(cache_dir, "llama-server", build)


def ensure_llama_tool(cache_dir: Path, target: str, flavour: str = "native") -> Path:
    """A llama.cpp binary (`llama-server`, `llama-perplexity`) of the build `flavour`, built on
    first use; a second target reuses the first one's libraries (a minute or two)."""
    build = cache_dir / ("build" if flavour == "native" else f"build-{flavour}")
    binary = build / "bin" / target
    if binary.exists():
        return binary
    if shutil.which("cmake") is None:
        raise RuntimeError(f"building {target} needs cmake (apt install cmake)")
    tree = source_tree(cache_dir)
    _run(["cmake", "-S", str(tree), "-B", str(build), *CMAKE_FLAGS, *BUILDS[flavour]], f"configuring ({flavour})")
    jobs = str(os.cpu_count() or 2)
    what = f"building {target} (about 13 min on 2 cores, the first target)"
    _run(["cmake", "--build", str(build), "--target", target, "-j", jobs], what)
    return binary


def gguf_type(dtype: str, quantization: str) -> str:
    """The GGUF type that serves the same weights as surge's `--dtype`/`--quantization`: Q8_0 for
    int8 (the same 8-bit grid), bf16 for bfloat16, else f32."""
    if quantization == "int8":
        return "q8_0"
    return "bf16" if dtype == "bfloat16" else "f32"


def ensure_gguf(model_dir: Path, cache_dir: Path, outtype: str = "f32") -> Path:
    """`model_dir` converted to GGUF (`f32`, `bf16`, or `q8_0` for 8-bit weights), once per model."""
    out = cache_dir / f"{model_dir.name}-{outtype}.gguf"
    if out.exists():
        return out
    tree = source_tree(cache_dir)
    _run([sys.executable, "-m", "pip", "install", "-q", "sentencepiece"], "installing the converter's sentencepiece")
    argv = [sys.executable, "-c", _CONVERT, str(tree), str(model_dir), "--outfile", str(out), "--outtype", outtype]
    _run(argv, f"converting {model_dir.name} to GGUF {outtype}")
    return out
