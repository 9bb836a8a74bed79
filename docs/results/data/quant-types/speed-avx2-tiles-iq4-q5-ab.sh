#!/usr/bin/env bash
# old (main at e3f8ea1) vs new (branch gemm) alternated, each part under its own hold of /work/bench.lock
D=/work/data/gemm; LB=/work/llama.cpp/build/bin; Q=/work/data/quant
ld() { echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)"; }
flock /work/bench.lock bash -c "
$(declare -f ld); D=$D
for i in 1 2; do for t in iq4_xs q5_k; do for v in old new; do ld; echo \"\\\$ GEMM_ONLY=rows gemm_bench.\$v 1 2048 2048 64 \$t 3\"; GEMM_ONLY=rows \$D/gemm_bench.\$v 1 2048 2048 64 \$t 3 | head -1; done; done; done; ld"
for f in iq4_xs q5_k_m; do
flock /work/bench.lock bash -c "
$(declare -f ld); D=$D
for v in old new; do ld; echo \"\\\$ kvsieve.\$v bench -m $Q/ks-$f.gguf -t 2 --n-prompt 512 --n-gen 1 --depth 0\"; \$D/kvsieve.\$v bench -m $Q/ks-$f.gguf -t 2 --n-prompt 512 --n-gen 1 --depth 0 2>&1 | grep -E '^prefill|^model'; done
ld; echo \"\\\$ llama-bench -m $Q/ks-$f.gguf -t 2 -p 512 -n 0 -r 1\"; $LB/llama-bench -m $Q/ks-$f.gguf -t 2 -p 512 -n 0 -r 1 2>&1 | grep -E '\\| *pp|model'
for v in new old; do ld; echo \"\\\$ kvsieve.\$v bench -m $Q/ks-$f.gguf -t 2 --n-prompt 512 --n-gen 1 --depth 0\"; \$D/kvsieve.\$v bench -m $Q/ks-$f.gguf -t 2 --n-prompt 512 --n-gen 1 --depth 0 2>&1 | grep -E '^prefill'; done; ld"
done
