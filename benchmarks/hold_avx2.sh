# Source this file to run the library, its tests or a benchmark on an AVX-512 machine with every
# numeric library held to the AVX2 instructions an AVX2-only CPU (e.g. AMD Zen 3) has:
#   source benchmarks/hold_avx2.sh && make test
# XLA's own code generation alone (`--xla_cpu_max_isa`) is not enough: XLA also calls oneDNN,
# which picks its kernels from the CPU's flags (it changed multi-device training results in the
# last bits; history: 2026-11-28), and PyTorch's BLAS is MKL. The CPU's caches and clock
# stay what they are, so this is an emulation, not an AVX2 machine. The compute dtype "auto"
# resolves to float32 under it, as on an AVX2-only CPU (`host.held_below_bf16`).
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_cpu_max_isa=AVX2"
export ONEDNN_MAX_CPU_ISA=AVX2          # oneDNN inside XLA and PyTorch
export MKL_ENABLE_INSTRUCTIONS=AVX2     # PyTorch's BLAS
export ATEN_CPU_CAPABILITY=avx2         # PyTorch's own kernels
export OPENBLAS_CORETYPE=Haswell        # NumPy's BLAS
export NPY_DISABLE_CPU_FEATURES="AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"
