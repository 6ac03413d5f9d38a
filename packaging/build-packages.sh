#!/usr/bin/env bash
# Builds edra's .deb and .rpm from this source tree: one release build, then
# `cargo deb --no-build` and `cargo generate-rpm`, and prints the package paths.
#
#   packaging/build-packages.sh                    # this machine's architecture
#   packaging/build-packages.sh --target aarch64   # or x86_64
#
# With --target the binary is built by cargo-zigbuild against glibc 2.17, so it runs on
# every distribution since 2014 (docs/building.md). Without it, cargo-zigbuild is used
# when installed, plain `cargo build` otherwise (then the packages require the build
# host's glibc version or newer). Needs cargo-deb and cargo-generate-rpm:
#   cargo install --locked cargo-deb cargo-generate-rpm
set -euo pipefail

usage() {
	sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
}

arch=""
while [ $# -gt 0 ]; do
	case "$1" in
	--target) arch="${2:-}"; shift 2 || { usage >&2; exit 64; } ;;
	--target=*) arch="${1#--target=}"; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "build-packages.sh: unknown argument $1" >&2; usage >&2; exit 64 ;;
	esac
done
case "$arch" in
"" | x86_64 | aarch64) ;;
*) echo "build-packages.sh: --target must be x86_64 or aarch64, not $arch" >&2; exit 64 ;;
esac

cd "$(dirname "$0")/.."
for tool in deb generate-rpm; do
	if ! cargo "$tool" --version >/dev/null 2>&1; then
		echo "build-packages.sh: cargo-$tool is missing: cargo install --locked cargo-deb cargo-generate-rpm" >&2
		exit 1
	fi
done
# cargo-zigbuild has no --version; it needs zig on PATH or the ziglang Python package.
has_zigbuild=false
if command -v cargo-zigbuild >/dev/null && { command -v zig >/dev/null || python3 -m ziglang version >/dev/null 2>&1; }; then
	has_zigbuild=true
fi

triple=""
if [ -n "$arch" ]; then
	triple="$arch-unknown-linux-gnu"
	if ! $has_zigbuild; then
		echo "build-packages.sh: --target needs cargo-zigbuild (docs/building.md)" >&2
		exit 1
	fi
elif $has_zigbuild; then
	triple="$(uname -m)-unknown-linux-gnu"
fi

deb_args=(--no-build)
rpm_args=()
if [ -n "$triple" ]; then
	echo "==> cargo zigbuild --release --target $triple.2.17" >&2
	cargo zigbuild --release --locked --target "$triple.2.17"
	binary="target/$triple/release/edra"
	# cargo-zigbuild leaves the binary under the plain triple; glibc 2.17 is guaranteed.
	deb_args+=(--target "$triple" --variant glibc217)
	rpm_args+=(--target "$triple")
else
	echo "==> cargo build --release (host glibc; install cargo-zigbuild for a 2.17 baseline)" >&2
	cargo build --release --locked
	binary="target/release/edra"
fi

# The newest glibc symbol version the binary needs: the rpm's requirement (the deb's
# comes from dpkg-shlibdeps or the glibc217 variant).
glibc="$(grep -ao 'GLIBC_2\.[0-9]*' "$binary" | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n | tail -n 1)"
if [ -z "$glibc" ]; then
	echo "build-packages.sh: $binary names no glibc version; is it a glibc build?" >&2
	exit 1
fi
rpm_args+=(--set-metadata "requires = { glibc = \">= $glibc\" }")

echo "==> cargo deb ${deb_args[*]}" >&2
deb="$(cargo deb "${deb_args[@]}" | tail -n 1)"
echo "==> cargo generate-rpm" >&2
cargo generate-rpm "${rpm_args[@]}"
rpm_dir="target/${triple:+$triple/}generate-rpm"
rpm="$(ls -t "$rpm_dir"/edra-*.rpm | head -n 1)"

echo "binary: $binary ($(stat -c %s "$binary") bytes, needs glibc >= $glibc)"
echo "deb:    $deb ($(stat -c %s "$deb") bytes)"
echo "rpm:    $rpm ($(stat -c %s "$rpm") bytes)"
