#!/usr/bin/env bash
# Installs the Debian packages kvsieve needs to build and test.  A no-op when
# everything is present, so every build target can call it.  `--reference`
# adds PyTorch for tools/reference.py, make_constructed_model.py and
# make_constructed_dlm.py (regenerating goldens and the constructed test model
# and its DLM; the tests only read the committed files), with OpenBLAS:
# Debian's torch otherwise calls the reference BLAS, ~40x slower; and SciPy,
# whose LP solver make_constructed_model.py uses for its recency kernels; and
# python3-jinja2, the reference renderer tools/jinja_goldens.py makes the
# chat-template goldens with.  `--train` and `--arm` are listed below.  KVSIEVE_SKIP_DEPS=1 skips entirely
# (e.g. non-Debian hosts).
set -euo pipefail
[ "${KVSIEVE_SKIP_DEPS:-0}" = 1 ] && exit 0
# --build: only what building needs (the Dockerfile's build stage), no test tools.
if [ "${1:-}" = "--build" ]; then
  pkgs=(build-essential cmake pkg-config libpcre2-dev libcjson-dev libcmocka-dev libmicrohttpd-dev)
else
pkgs=(build-essential cmake pkg-config libpcre2-dev libcjson-dev libcmocka-dev
      clang libclang-rt-14-dev python3 python3-numpy
      libmicrohttpd-dev curl nodejs    # kvsieve serve (HTTP) and its tests (curl, the OpenAI Node client)
      chromium)                        # the chat page's browser test (tests/server/chat_page.sh), headless
# Debian's npm, unless an npm is already there (NodeSource's nodejs bundles one and conflicts with it)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)
fi
[ "${1:-}" = "--reference" ] && pkgs+=(python3-torch libopenblas0-pthread python3-scipy python3-jinja2)
# --train: tools/train_model.py (the bundled model) and tools/make_dlm.py: PyTorch,
# SentencePiece, tcmalloc (Debian's torch page-faults every large activation under
# glibc malloc), and the Debian packages whose English text is the corpus.
[ "${1:-}" = "--train" ] && pkgs+=(python3-torch libopenblas0-pthread python3-numpy python3-sentencepiece
                                 libtcmalloc-minimal4 bible-kjv fortunes dict-gcide)
# --train also installs the documentation whose English prose is the gpu-large recipe's corpus
# (tools/build_corpus.py reads exactly these, with the three above; docs/MODEL.md lists their sizes).
# Not nodejs-doc: it conflicts with NodeSource's nodejs, and Debian's nodejs replaces that.
[ "${1:-}" = "--train" ] && pkgs+=($(/usr/bin/python3 "$(dirname "$0")/../tools/build_corpus.py" --list-packages))
# --arm: the aarch64 cross build and its emulated test run (`make test-arm`,
# cmake/aarch64-linux-gnu.cmake): Debian's cross compiler, QEMU's user-mode
# emulator, and through multiarch the arm64 builds of the libraries above.
if [ "${1:-}" = "--arm" ]; then
  pkgs=(cmake pkg-config gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
        libpcre2-dev:arm64 libcjson-dev:arm64 libcmocka-dev:arm64 libmicrohttpd-dev:arm64)
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "deps: adding the arm64 architecture (multiarch)" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO dpkg --add-architecture arm64
  fi
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
[ "${1:-}" = "--build" ] && exit 0
# The official OpenAI Node client for tests/server/openai_node.sh, pinned by
# tests/server/node/package-lock.json, into that test-only folder.  Tests never
# download: without node_modules the test is skipped.
[ "${1:-}" = "--arm" ] && exit 0   # the Node client is the host's, already set up by a native build
node_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/server/node"
if [ ! -f "$node_dir/node_modules/openai/package.json" ] && command -v npm >/dev/null 2>&1; then
  echo "deps: npm ci in tests/server/node (the openai package, test-only)" >&2
  (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error >&2) || echo "deps: npm ci failed; the OpenAI Node client test will be skipped" >&2
fi
# puppeteer-core (no browser of its own: it drives Debian's chromium) for
# tests/server/chat_page.sh, pinned by tests/server/browser/package-lock.json.
browser_dir="$(cd "$(dirname "$0")/.." && pwd)/tests/server/browser"
if [ ! -f "$browser_dir/node_modules/puppeteer-core/package.json" ] && command -v npm >/dev/null 2>&1; then
  echo "deps: npm ci in tests/server/browser (puppeteer-core, test-only)" >&2
  (cd "$browser_dir" && npm ci --no-audit --no-fund --loglevel=error >&2) || echo "deps: npm ci failed; the chat page test will be skipped" >&2
fi
exit 0
