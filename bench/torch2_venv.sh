#!/usr/bin/env bash
# torch2_venv.sh: a bench-only virtual environment with PyTorch 2.x from PyPI,
# the opponent of bench/torch_versions.py (issue 36). Not CI's: CI never
# downloads it (its test venv, .venv, has no torch; the tests use Debian's
# python3-torch 1.13).
#
#     bench/torch2_venv.sh [DIR]        # default: .venv-torch2 at the repository root
#     PW_BENCH_PYTHON=DIR/bin/python3 /usr/bin/python3 bench/torch_versions.py
#
# PyPI's Linux x86-64 torch wheel is the CUDA build; on a CPU it runs as is.
# It is installed with --no-deps, with what it needs to import: its pure-Python
# Requires-Dist, numpy, and of its CUDA wheels only those whose libraries
# libtorch_cuda.so loads at import and the machine's CUDA toolkit
# (/usr/local/cuda/lib64, 13.0 here) lacks: NCCL, cuSPARSELt, NVSHMEM, cuFile.
# The rest (cuBLAS, cuDNN, cuFFT, ...) come from the toolkit through
# LD_LIBRARY_PATH, which the venv's bin/python3 wrapper sets. No triton, no
# cuda-toolkit wheels: the CPU path needs neither (~3 GB saved).
#
# Idempotent: a venv whose torch already has the pinned version and imports
# is left as it is. Versions pinned below; change them together.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$ROOT/.venv-torch2}
BASE_PY=${PW_TORCH2_BASE_PYTHON:-/usr/bin/python3}   # Debian 12's Python 3.11: the wheels are cp311
CUDA_LIB=${PW_TORCH2_CUDA_LIB:-/usr/local/cuda/lib64}

TORCH=torch==2.15.0
# tests/ref/test_hf_ref_v5.sh's reference (Qwen3, transformers 5's config
# files): installed with its own requirements, resolved by pip (tokenizers,
# huggingface-hub, safetensors, ...; a bench and reference environment, not CI's)
TRANSFORMERS=transformers==5.24.0
PURE=(filelock==4.3.1 typing-extensions==4.16.0 sympy==1.14.0 mpmath==1.3.0 networkx==3.6.1
      jinja2==3.1.6 markupsafe==3.0.3 fsspec==2026.9.0 numpy==2.4.6)
NVIDIA=(nvidia-nccl-cu13==2.30.7 nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2
        nvidia-cufile==1.17.1.22)

say() { echo "torch2_venv: $*" >&2; }

want=${TORCH#torch==}
if [ -x "$DIR/bin/python3" ] && got=$("$DIR/bin/python3" -c 'import torch; print(torch.__version__)' 2>/dev/null) \
   && [ "${got%%+*}" = "$want" ]; then
    if tv=$("$DIR/bin/python3" -c 'import transformers; print(transformers.__version__)' 2>/dev/null) \
       && [ "$tv" = "${TRANSFORMERS#transformers==}" ]; then
        say "$DIR: torch $got and transformers $tv already there"
        exit 0
    fi
    say "$DIR: torch $got there; installing $TRANSFORMERS"
    exec "$DIR/bin/python3" -m pip install --quiet --only-binary=:all: "$TRANSFORMERS"
fi
[ -d "$CUDA_LIB" ] || say "warning: $CUDA_LIB missing: the CUDA wheel of torch will not import without cuBLAS and cuDNN"

say "creating $DIR with $($BASE_PY --version)"
[ -x "$DIR/bin/python-real" ] || "$BASE_PY" -m venv "$DIR"
say "installing $TORCH (--no-deps), ${PURE[*]}, ${NVIDIA[*]}"
"$DIR/bin/python3" -m pip install --no-deps --only-binary=:all: "$TORCH" "${PURE[@]}" "${NVIDIA[@]}"
"$DIR/bin/python3" -m pip install --quiet --only-binary=:all: "$TRANSFORMERS"

# bin/python3 becomes a wrapper that puts the CUDA toolkit's libraries on the
# loader's path (libtorch_cuda.so is linked against them), so that
# PW_BENCH_PYTHON=DIR/bin/python3 works from any shell.
if [ ! -e "$DIR/bin/python-real" ]; then
    real=$(readlink -f "$DIR/bin/python3")
    rm -f "$DIR/bin/python3"
    ln -s "$real" "$DIR/bin/python-real"
    cat > "$DIR/bin/python3" <<EOF
#!/bin/sh
# torch2_venv.sh: the venv's python with the CUDA toolkit's libraries on the loader's path
export LD_LIBRARY_PATH="$CUDA_LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$DIR/bin/python-real" "\$@"
EOF
    chmod +x "$DIR/bin/python3"
fi
"$DIR/bin/python3" -c 'import torch; print("torch2_venv: torch", torch.__version__, "imports; CPU capability",
    torch.backends.cpu.get_cpu_capability(), "; threads", torch.get_num_threads())'
