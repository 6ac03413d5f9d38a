#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS seconds (default 10): the CI fuzz step.
# Needs a nightly toolchain and cargo-fuzz (installed when missing). Without nightly it
# says so loudly and exits 0: the property tests in `cargo test` (src/fuzzing/) cover the
# same parsers on every toolchain. A crash, panic, timeout or memory blow-up fails (exit 1)
# and leaves the input under fuzz/artifacts/<target>/.
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-10}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(kubeconfig gpu_config status watch authority hook_state)

fallback() {
	printf '\n%s\n' "************************************************************************"
	printf '%s\n' "FUZZING SKIPPED: $1"
	printf '%s\n' "Falling back to the property tests run by cargo test (src/fuzzing/)."
	printf '%s\n\n' "************************************************************************"
	exit 0
}

if ! command -v rustup >/dev/null || ! rustup run nightly rustc --version >/dev/null 2>&1; then
	fallback "no nightly Rust toolchain (cargo-fuzz needs one: rustup toolchain install nightly)"
fi
if ! command -v cargo-fuzz >/dev/null; then
	echo "installing cargo-fuzz"
	cargo install --locked --quiet cargo-fuzz || fallback "cargo-fuzz could not be installed"
fi

echo "nightly: $(rustup run nightly rustc --version)"
start=$(date +%s)
# No sanitizer: the targets run safe Rust; a panic aborts and libFuzzer reports it.
cargo +nightly fuzz build --sanitizer none
echo "fuzz build: $(($(date +%s) - start)) s"

for target in "${targets[@]}"; do
	echo "fuzz $target: ${seconds} s (corpus fuzz/corpus/$target, seeds fuzz/seeds/$target)"
	mkdir -p "corpus/$target" artifacts
	log="artifacts/$target.log"
	# -timeout: one input taking 10 s is a bug; -rss_limit_mb: so is 2 GiB of memory.
	status=0
	cargo +nightly fuzz run --sanitizer none "$target" "corpus/$target" "seeds/$target" -- \
		-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || status=$?
	grep -E '^stat::(number_of_executed_units|peak_rss_mb)|^Done' "$log" || true
	if [ "$status" -ne 0 ]; then
		tail -n 40 "$log"
		echo "FUZZ FAILURE in $target (exit $status): the input is under fuzz/artifacts/$target/; reproduce with"
		echo "  cd fuzz && cargo +nightly fuzz run --sanitizer none $target artifacts/$target/<file>"
		exit 1
	fi
done
echo "fuzzing: ${#targets[@]} targets x ${seconds} s, total $(($(date +%s) - start)) s with the build"
