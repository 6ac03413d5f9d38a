#!/usr/bin/env bash
# Checks that an edra binary links only glibc's own shared libraries (libc, libm,
# libpthread, libdl, librt and the dynamic loader), so one binary runs on every current
# glibc distribution and can still dlopen NVML. A plain `cargo build` also links
# libgcc_s (GCC's unwinder); the release builds made with cargo-zigbuild do not, and
# `--allow-libgcc` accepts it for host builds. Prints the libraries and the newest glibc
# symbol version the binary needs.
#
#   packaging/check-binary.sh [--allow-libgcc] target/x86_64-unknown-linux-gnu/release/edra
set -euo pipefail

allow_libgcc=false
if [ "${1:-}" = "--allow-libgcc" ]; then
	allow_libgcc=true
	shift
fi
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
	echo "usage: check-binary.sh [--allow-libgcc] BINARY" >&2
	exit 64
fi
bin="$1"
command -v readelf >/dev/null || { echo "check-binary.sh: readelf (binutils) is missing" >&2; exit 1; }

allowed='^(libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|ld-linux-x86-64\.so\.2|ld-linux-aarch64\.so\.1)$'
if $allow_libgcc; then
	allowed="${allowed%)\$}|libgcc_s\.so\.1)\$"
fi
needed="$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
interp="$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
problems=0
echo "binary:      $bin ($(stat -c %s "$bin") bytes)"
echo "interpreter: ${interp:-none}"
for lib in $needed; do
	if [[ "$lib" =~ $allowed ]]; then
		echo "needs:       $lib"
	else
		echo "FAIL: links $lib, which is not one of glibc's own libraries (build with cargo-zigbuild, docs/building.md)" >&2
		problems=$((problems + 1))
	fi
done
case "$interp" in
/lib64/ld-linux-x86-64.so.2 | /lib/ld-linux-aarch64.so.1) ;;
*) echo "FAIL: unexpected program interpreter '${interp}' (a static or musl binary cannot load NVML)" >&2
	problems=$((problems + 1)) ;;
esac
glibc="$(readelf -V "$bin" | grep -o 'GLIBC_2\.[0-9]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n | tail -n 1)"
echo "glibc:       >= ${glibc:-unknown}"
if readelf -S "$bin" | grep -q '\.debug_info'; then
	echo "FAIL: the binary is not stripped" >&2
	problems=$((problems + 1))
fi
if [ "$problems" -gt 0 ]; then
	exit 1
fi
echo "ok"
