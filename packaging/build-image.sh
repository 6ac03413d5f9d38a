#!/usr/bin/env bash
# Builds edra's image archive, edra-<version>-<amd64|arm64>.oci.tar.zst, for k3s's images
# folder (/var/lib/rancher/k3s/agent/images/), `ctr images import`, `podman load` and
# `docker load`: edra at /usr/bin/edra on glibc's own libraries from Debian's libc6 package,
# nothing else (no shell), named localhost/edra:<version>, labelled with its version, source
# and revision. No registry, no base image, no Dockerfile. The same binary, libc6 package and
# SOURCE_DATE_EPOCH (default: the commit's time) give the same bytes.
#
#   packaging/build-image.sh --arch x86_64|aarch64 [--binary FILE] [--libc6 FILE.deb] [--out DIR]
#
# --binary defaults to the cargo-zigbuild release build, target/<arch>-unknown-linux-gnu/
# release/edra (packaging/build-packages.sh --target <arch> makes it). --libc6 defaults to
# Debian's libc6 for that architecture, downloaded with apt-get from this machine's apt
# sources (a list of their own, so nothing here changes) and kept in
# ${EDRA_CI_CACHE:-/var/cache/edra-ci}/libc6/. The label org.opencontainers.image.source is
# EDRA_IMAGE_SOURCE when set. Needs python3, zstd, readelf, dpkg-deb (and apt-get to download).
set -euo pipefail

usage() {
	sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
}

arch="" binary="" deb="" out=""
while [ $# -gt 0 ]; do
	case "$1" in
	--arch | --binary | --libc6 | --out)
		[ $# -ge 2 ] || { usage >&2; exit 64; }
		case "$1" in --arch) arch="$2" ;; --binary) binary="$2" ;; --libc6) deb="$2" ;; --out) out="$2" ;; esac
		shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) echo "build-image.sh: unknown argument $1" >&2; usage >&2; exit 64 ;;
	esac
done
case "$arch" in
x86_64) debarch=amd64 loader_link=lib64/ld-linux-x86-64.so.2 ;;
aarch64) debarch=arm64 loader_link=lib/ld-linux-aarch64.so.1 ;;
*) echo "build-image.sh: --arch must be x86_64 or aarch64, not '${arch}'" >&2; exit 64 ;;
esac
triple="$arch-linux-gnu"

cd "$(dirname "$0")/.."
for tool in python3 zstd readelf dpkg-deb; do
	command -v "$tool" >/dev/null || { echo "build-image.sh: $tool is missing (apt-get install python3 zstd binutils dpkg)" >&2; exit 1; }
done
binary="${binary:-target/$arch-unknown-linux-gnu/release/edra}"
if [ ! -f "$binary" ]; then
	echo "build-image.sh: $binary does not exist: build it with packaging/build-packages.sh --target $arch (or give --binary)" >&2
	exit 66
fi
machine="$(readelf -h "$binary" | sed -n 's/^ *Machine: *//p')"
case "$arch:$machine" in
x86_64:*X86-64* | aarch64:*AArch64*) ;;
*) echo "build-image.sh: $binary is built for '$machine', not $arch" >&2; exit 1 ;;
esac
# Only glibc's own libraries, stripped, the standard loader (the release build's checks).
packaging/check-binary.sh "$binary" >/dev/null || { packaging/check-binary.sh "$binary" >&2; exit 1; }

cache="${EDRA_CI_CACHE:-/var/cache/edra-ci}/libc6"
if [ -z "$deb" ]; then
	command -v apt-get >/dev/null || { echo "build-image.sh: no apt-get here: give Debian's libc6_*_$debarch.deb with --libc6" >&2; exit 1; }
	lists="$cache/lists-$debarch"
	mkdir -p "$lists/partial" "$cache/apt-$debarch/archives/partial"
	apt_opts=(-o "APT::Architecture=$debarch" -o "APT::Architectures::=$debarch" -o "Dir::State::Lists=$lists"
		-o "Dir::Cache=$cache/apt-$debarch" -o "Dir::State::status=/dev/null" -o "APT::Sandbox::User=root")
	if apt-get "${apt_opts[@]}" update -qq >&2 && (cd "$cache" && apt-get "${apt_opts[@]}" download -qq "libc6:$debarch" >&2); then
		deb="$(ls -t "$cache"/libc6_*_"$debarch".deb | head -n 1)"
	else
		deb="$(ls -t "$cache"/libc6_*_"$debarch".deb 2>/dev/null | head -n 1 || true)"
		[ -n "$deb" ] || { echo "build-image.sh: could not download libc6:$debarch, and none is cached in $cache" >&2; exit 1; }
		echo "build-image.sh: WARNING: could not download libc6:$debarch; using the cached $deb" >&2
	fi
fi
[ -f "$deb" ] || { echo "build-image.sh: $deb: file not found" >&2; exit 66; }
[ "$(dpkg-deb -f "$deb" Package):$(dpkg-deb -f "$deb" Architecture)" = "libc6:$debarch" ] ||
	{ echo "build-image.sh: $deb is not Debian's libc6 for $debarch" >&2; exit 1; }
libc_version="$(dpkg-deb -f "$deb" Version)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work"
libdir="lib/$triple"
loader="$(readelf -l "$binary" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
[ "/$loader_link" = "$loader" ] || { echo "build-image.sh: $binary asks for the loader $loader, not /$loader_link" >&2; exit 1; }
[ -L "$work/$loader_link" ] || { echo "build-image.sh: $deb has no $loader_link" >&2; exit 1; }
# glibc's libraries: those the binary needs, and those NVML (loaded at run time) needs.
libs=(libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1)
for lib in $(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
	[ "$lib" = "$(basename "$loader")" ] || [[ " ${libs[*]} " == *" $lib "* ]] || libs+=("$lib")
done
args=(--file "usr/bin/edra=$binary:755" --link "$loader_link=$(readlink "$work/$loader_link")")
args+=(--file "$libdir/$(basename "$loader")=$work/$libdir/$(basename "$loader"):755")
for lib in "${libs[@]}"; do
	[ -f "$work/$libdir/$lib" ] || { echo "build-image.sh: $deb has no $libdir/$lib" >&2; exit 1; }
	args+=(--file "$libdir/$lib=$work/$libdir/$lib:644")
done
# glibc's licence travels with it.
args+=(--file "usr/share/doc/libc6/copyright=$work/usr/share/doc/libc6/copyright:644")

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ "$revision" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
	revision="$revision-dirty"
fi
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
name="localhost/edra:$version"
labels=(
	"org.opencontainers.image.title=edra"
	"org.opencontainers.image.description=Kubernetes DRA driver for GPUs on small edge clusters"
	"org.opencontainers.image.version=$version"
	"org.opencontainers.image.revision=$revision"
	"org.opencontainers.image.created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"
	"org.opencontainers.image.licenses=Apache-2.0"
	"dev.edra.libc6=Debian libc6 $libc_version"
)
source="${EDRA_IMAGE_SOURCE:-$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -n 1)}"
if [ -n "$source" ]; then
	labels+=("org.opencontainers.image.source=$source")
else
	echo "build-image.sh: WARNING: no source URL (EDRA_IMAGE_SOURCE, or repository in Cargo.toml): label org.opencontainers.image.source left out" >&2
fi
for l in "${labels[@]}"; do args+=(--label "$l"); done

out="${out:-target/image}"
mkdir -p "$out"
archive="$out/edra-$version-$debarch.oci.tar.zst"
python3 packaging/oci-image.py --out "$work/image.tar" --name "$name" --arch "$debarch" --epoch "$epoch" \
	--env PATH=/usr/bin --entrypoint /usr/bin/edra --cmd run "${args[@]}" >"$work/written"
# One thread, a fixed level: the same tar gives the same bytes.
zstd -q -f -19 -T1 "$work/image.tar" -o "$archive"
echo "image: $archive ($(stat -c %s "$archive") bytes; $(cat "$work/written"); uncompressed $(stat -c %s "$work/image.tar") bytes; libc6 $libc_version; SOURCE_DATE_EPOCH=$epoch)"
