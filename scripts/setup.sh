#!/usr/bin/env bash
# scripts/setup.sh: installs the Debian 12 packages gpt2d needs to build, test
# and benchmark, when they are missing. Idempotent; uses sudo when not root.
set -euo pipefail

packages=(
    build-essential meson ninja-build pkg-config clang   # toolchain, libFuzzer
    clang-format git                                     # the format check
    libjansson-dev check                                 # JSON, unit tests
    libmicrohttpd-dev libuv1-dev libopenblas-dev         # server, loop, BLAS
    libsystemd-dev systemd                               # sd_notify, systemd tools
    python3 python3-numpy                                # numeric reference
    curl ca-certificates valgrind wrk
    nginx-light python3-yaml                             # scale-out tests
    chromium prometheus                                  # playground test, promtool
)

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js (tiktoken, the OpenAI client): Debian's nodejs and npm, unless a
# node and npm are already there (NodeSource's nodejs bundles npm and
# conflicts with Debian's npm package).
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "setup: installing ${missing[*]}" >&2
sudo=()
[ "$(id -u)" = 0 ] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
