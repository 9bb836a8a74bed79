# kvsieve — top-level convenience targets.  Every target that builds first
# runs scripts/deps.sh (a no-op when the Debian packages are present), so on a
# fresh Debian 12 machine `make run` and `make test` are all the set-up.
BUILD     ?= build
JOBS      ?= 2
CMAKE_OPTS ?=
FUZZ_SECONDS ?= 60
FIXTURES  ?= $(CURDIR)/tests/fixtures
KVSIEVE   := $(BUILD)/kvsieve
# `make run` uses the bundled model (models/kvsieve-default.gguf), else the real
# pretrained tiny llama from the test fixtures, or else a generated model.
RUN_MODEL ?= $(firstword $(wildcard models/kvsieve-default.gguf) $(wildcard $(FIXTURES)/models/aidreams260K.gguf) $(BUILD)/models/tiny-llama-q8_0.gguf)
PROMPT    ?= A pass key is hidden in the text below. Remember it. The pass key is 31415. 31415 is the pass key. The quiet farmer walks near the old bridge. A small bird sings by the river today. What is the pass key? The pass key is
N         ?= 8

.PHONY: test-arm bench-policies bench-memcap bench-serve all deps reference-deps build test run asan fuzz cuda-check bench clean install

all: build

deps:
	@bash scripts/deps.sh

# PyTorch for tools/reference.py (only to regenerate tests/golden).
reference-deps:
	@bash scripts/deps.sh --reference

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_OPTS) > /dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The binary, include/*.h, the modules' static libraries (LIBDIR/kvsieve/) and
# kvsieve.pc under PREFIX; DESTDIR stages the tree for packaging.
PREFIX ?= /usr/local
install: build
	DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix $(PREFIX)

$(BUILD)/models/tiny-llama-q8_0.gguf: | build
	@mkdir -p $(BUILD)/models
	$(KVSIEVE) gen-model --shape tiny-llama --type q8_0 --vocab-from $(FIXTURES)/tokenizer/ggml-vocab-llama-spm.gguf --out $@

run: build $(RUN_MODEL)
	$(KVSIEVE) run -m $(RUN_MODEL) -p "$(PROMPT)" -n $(N) --temp 0

# The aarch64 build and its suite under QEMU user-mode emulation (README.md,
# "aarch64 Linux"): cross-compiled into build-arm64 with Debian's
# gcc-aarch64-linux-gnu (cmake/aarch64-linux-gnu.cmake), then the CTest suite
# once per emulated CPU in ARM_CPUS: `max` has dotprod and i8mm (the sdot and
# smmla kernels run), `cortex-a53` has neither (plain NEON).  KS_EXPECT_SIMD
# tells test_dispatch which level each must detect.  Tests labelled
# emu_slow (cmake/cross.cmake says which and why) are left out.  ARM_TESTS,
# a CTest regex, runs only the tests it matches (CI's bounded subset, .ci/run).
ARM_BUILD ?= build-arm64
ARM_CPUS  ?= max cortex-a53
ARM_TESTS ?=
test-arm:
	@bash scripts/deps.sh --arm
	@cmake -S . -B $(ARM_BUILD) -DCMAKE_TOOLCHAIN_FILE=$(CURDIR)/cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release $(CMAKE_OPTS) > /dev/null
	@cmake --build $(ARM_BUILD) -j $(JOBS)
	@for cpu in $(ARM_CPUS); do \
	  case $$cpu in max) lv=i8mm;; cortex-a76|neoverse-n1) lv=dotprod;; *) lv=neon;; esac; \
	  echo "== QEMU_CPU=$$cpu (expects $$lv)"; \
	  (cd $(ARM_BUILD) && QEMU_CPU=$$cpu KS_EXPECT_SIMD=$$lv ctest --output-on-failure -j $(JOBS) -LE emu_slow $(if $(ARM_TESTS),-R '$(ARM_TESTS)')) || exit 1; \
	done

# Address + undefined-behaviour sanitizers over the whole suite.
asan: deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVSIEVE_SANITIZE=ON > /dev/null
	@cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS)

# libFuzzer on the GGUF, safetensors and torch.save parsers, the server's
# request-body parser, the prefix cache's block reader and the chat-template
# interpreter (clang), FUZZ_SECONDS in all: each of the six fuzzers runs for a
# sixth of it.
FUZZ_EACH = $(shell echo $$(( ($(FUZZ_SECONDS) + 5) / 6 )))
fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVSIEVE_FUZZ=ON > /dev/null
	@cmake --build build-fuzz --target fuzz_gguf fuzz_safetensors fuzz_torch_bin fuzz_request fuzz_prefix fuzz_jinja -j $(JOBS)
	@mkdir -p build-fuzz/corpus && cp -n tests/fuzz/corpus/* build-fuzz/corpus/ 2>/dev/null || true
	@mkdir -p build-fuzz/corpus_safetensors && cp -n tests/fuzz/corpus_safetensors/* build-fuzz/corpus_safetensors/ 2>/dev/null || true
	build-fuzz/fuzz_gguf -max_total_time=$(FUZZ_EACH) -rss_limit_mb=2048 -max_len=65536 build-fuzz/corpus
	build-fuzz/fuzz_safetensors -max_total_time=$(FUZZ_EACH) -rss_limit_mb=2048 -max_len=65536 -dict=tests/fuzz/safetensors.dict build-fuzz/corpus_safetensors
	@mkdir -p build-fuzz/corpus_torch_bin && cp -n tests/fuzz/corpus_torch_bin/* build-fuzz/corpus_torch_bin/ 2>/dev/null || true
	build-fuzz/fuzz_torch_bin -max_total_time=$(FUZZ_EACH) -rss_limit_mb=2048 -max_len=65536 -dict=tests/fuzz/torch_bin.dict build-fuzz/corpus_torch_bin
	@mkdir -p build-fuzz/corpus_request && cp -n tests/fuzz/corpus_request/* build-fuzz/corpus_request/ 2>/dev/null || true
	build-fuzz/fuzz_request -max_total_time=$(FUZZ_EACH) -rss_limit_mb=2048 -max_len=16384 build-fuzz/corpus_request
	@mkdir -p build-fuzz/corpus_prefix && cp -n tests/fuzz/corpus_prefix/* build-fuzz/corpus_prefix/ 2>/dev/null || true
	build-fuzz/fuzz_prefix -max_total_time=$(FUZZ_EACH) -rss_limit_mb=2048 -max_len=65536 build-fuzz/corpus_prefix
	@mkdir -p build-fuzz/corpus_jinja && cp -n tests/fuzz/corpus_jinja/* build-fuzz/corpus_jinja/ 2>/dev/null || true
	build-fuzz/fuzz_jinja -max_total_time=$(FUZZ_EACH) -rss_limit_mb=2048 -max_len=32768 build-fuzz/corpus_jinja

# Compile-check the optional CUDA code, target ks_cuda (no GPU needed; not used
# by the engine yet: src/cuda/ks_cuda.h).
cuda-check: deps
	@cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DKVSIEVE_CUDA=ON > /dev/null
	@cmake --build build-cuda -j $(JOBS) --target ks_cuda

BENCH_MODEL ?= $(BUILD)/models/llama-3.2-1b-q8_0.gguf
$(BUILD)/models/llama-3.2-1b-q8_0.gguf: | build
	@mkdir -p $(BUILD)/models
	$(KVSIEVE) gen-model --shape llama-3.2-1b --type q8_0 --vocab-from $(FIXTURES)/tokenizer/ggml-vocab-llama-spm.gguf \
	  --out $@ --dlm-out $(BUILD)/models/llama-3.2-1b-q8_0-dlm

# The benchmark of docs/BENCHMARKS.md (generates a Llama-3.2-1B-shaped model once).
bench: build $(BENCH_MODEL)
	$(KVSIEVE) bench -m $(BENCH_MODEL) --depth 0,4096,16384,32768 --batch 1,4,16 -t 2 --n-gen 8 --n-prompt 256

# Every policy side by side at budget 2048 (docs/BENCHMARKS.md, "Policies"); spec uses the
# random retrieval head gen-model wrote beside the model.
bench-policies: build $(BENCH_MODEL)
	$(KVSIEVE) bench -m $(BENCH_MODEL) --depth 4096,16384,32768 --batch 1,4,16 -t 2 --n-gen 4 --no-prefill \
	  --policy dense,streaming,h2o,quest,freekv,lrqk,chess,spec --budget 2048

# SpeContext's adaptive memory management against static splits under a fast-tier cap.
bench-memcap: build $(BENCH_MODEL)
	$(KVSIEVE) bench -m $(BENCH_MODEL) --depth 4096,8192,16384,32768 --batch 4 -t 2 --n-gen 4 --no-prefill \
	  --policy spec --budget 2048 --mem-cap 4G --offload none,all,adaptive

# The serving benchmark (tools/bench_serve.py; docs/SERVER.md): R concurrent
# streamed requests of SERVE_IN prompt and SERVE_OUT generated tokens against
# `kvsieve serve` on BENCH_MODEL, dense, quest and spec on the same request
# mix; SERVE_FLAGS go to the server (e.g. SERVE_FLAGS="--mem-cap 2G").
SERVE_R ?= 8
SERVE_IN ?= 1024
SERVE_OUT ?= 4096
SERVE_BUDGET ?= 1024
SERVE_FLAGS ?=
bench-serve: build $(BENCH_MODEL)
	python3 tools/bench_serve.py --spawn "$(KVSIEVE) serve -m $(BENCH_MODEL) -t 2 --parallel $(SERVE_R) -c $$(( $(SERVE_IN) + $(SERVE_OUT) + 16 )) $(SERVE_FLAGS)" \
	  -R $(SERVE_R) --input-len $(SERVE_IN) --output-len $(SERVE_OUT) --policy dense,quest,spec --budget $(SERVE_BUDGET)

clean:
	rm -rf $(BUILD) build-asan build-fuzz build-cuda $(ARM_BUILD)
