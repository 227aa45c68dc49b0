# nightshift — common tasks. `just --list` shows them.

# Train a local swarm (bootstrap + 3 nodes) on the embedded corpus.
demo *ARGS:
    cargo run --release -p nightshift-node -- demo --report demo-report.json --plot demo-loss.svg {{ARGS}}

# The test suite (what CI runs).
test:
    cargo test --workspace

# fmt + clippy + docs + tests, as CI does.
check:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
    cargo test --workspace
    cargo check -p nightshift-node --features cuda

# On a machine with an NVIDIA GPU: a two-node swarm on the GPU at the medium preset; prints
# tokens/s per node and model FLOPs utilisation (writes gpu-check.json).
gpu-check:
    bash scripts/gpu_check.sh

# Benchmarks recorded in BENCHMARKS.md.
bench:
    bash scripts/bench.sh

# Rewrite BENCHMARKS.md from the result files in docs/bench/ (`--check` compares instead).
bench-page *ARGS:
    python3 scripts/benchmarks.py {{ARGS}}

# The lab's benchmarks and experiments (convergence, churn, byzantine, replay, report).
lab *ARGS:
    cargo build --release -p nightshift-node -p nightshift-lab
    ./target/release/nightshift-lab {{ARGS}}
