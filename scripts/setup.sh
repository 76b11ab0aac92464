#!/usr/bin/env bash
# scripts/setup.sh [--fast|--test]: installs the Debian 12 packages gpt2d
# needs, when they are missing. Idempotent; uses sudo when not root.
#   scripts/setup.sh          what building and serving need (scripts/run.sh)
#   scripts/setup.sh --fast   that and what the `fast` test suite needs: the
#                             check library, PyYAML (scripts/test.sh --fast)
#   scripts/setup.sh --test   that and the test and benchmark tools:
#                             chromium, promtool, valgrind, nginx, clang,
#                             wrk, numpy, PyTorch, Node.js, oneDNN (libdnnl-dev, for
#                             bench/bench_dnnl only)... (scripts/test.sh)
set -euo pipefail

packages=(
    gcc libc6-dev meson ninja-build pkg-config           # toolchain (C only)
    libjansson-dev libmicrohttpd-dev libuv1-dev          # JSON, HTTP, event loop
    libopenblas-dev libsystemd-dev                       # BLAS, sd_notify
    python3                                              # the build's page embedding
    curl ca-certificates                                 # scripts/download.sh
)
fast_packages=(
    check                                                # unit tests
    python3-yaml                                         # the Kubernetes manifests' check
)
test_packages=(
    "${fast_packages[@]}"
    build-essential clang                                # libFuzzer
    clang-format git                                     # the format check
    libgnutls28-dev openssl                              # HTTPS (-Dtls=auto); test certificates
    systemd                                              # systemd tools
    python3-numpy                                        # numeric reference
    python3-torch                                        # the LoRA reference (tests/test_lora_reference.py)
    valgrind wrk
    nginx-light                                          # scale-out tests
    chromium prometheus                                  # playground test, promtool
    libdnnl-dev                                          # bench_dnnl only (oneDNN): benchmark-only
)
case "${1:-}" in
"") ;;
--fast) packages+=("${fast_packages[@]}") ;;
--test) packages+=("${test_packages[@]}") ;;
*)
    echo "usage: scripts/setup.sh [--fast|--test]" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js (tiktoken, the OpenAI client), for the tests: Debian's nodejs and
# npm, unless a node and npm are already there (NodeSource's nodejs bundles
# npm and conflicts with Debian's npm package).
if [ "${1:-}" = --test ]; then
    command -v node >/dev/null || missing+=(nodejs)
    command -v npm >/dev/null || missing+=(npm)
fi
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "setup: installing ${missing[*]}" >&2
sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
