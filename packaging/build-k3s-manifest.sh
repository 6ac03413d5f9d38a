#!/usr/bin/env bash
# Writes edra-k3s.yaml, the one file a k3s server applies from its manifests folder
# (/var/lib/rancher/k3s/server/manifests/): the namespace, service account and DaemonSet
# (config/daemonset.yaml), the RBAC (config/rbac.yaml), the admission policy
# (config/admission-policy.yaml) and the DeviceClasses (config/deviceclasses.yaml, for
# Kubernetes 1.34+; --v1beta1 takes config/deviceclasses-v1beta1.yaml, for 1.32 and 1.33),
# copied as they are. The DaemonSet's image, localhost/edra:<version>, comes from the
# image archive packaging/build-image.sh writes; this checks that it names this version.
#
#   packaging/build-k3s-manifest.sh [--v1beta1] [--out FILE]    # default target/dist/edra-k3s.yaml
set -euo pipefail

usage() {
	sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
}

out="" classes=deviceclasses.yaml
while [ $# -gt 0 ]; do
	case "$1" in
	--out) [ $# -ge 2 ] || { usage >&2; exit 64; }; out="$2"; shift 2 ;;
	--v1beta1) classes=deviceclasses-v1beta1.yaml; shift ;;
	-h | --help) usage; exit 0 ;;
	*) echo "build-k3s-manifest.sh: unknown argument $1" >&2; usage >&2; exit 64 ;;
	esac
done
cd "$(dirname "$0")/.."
out="${out:-target/dist/edra-k3s.yaml}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
image="localhost/edra:$version"
# Every image line of the DaemonSet names this version's archive.
images="$(sed -n 's/^ *image: *//p' config/daemonset.yaml | sort -u)"
if [ "$images" != "$image" ]; then
	echo "build-k3s-manifest.sh: config/daemonset.yaml names image(s) '$(echo $images)', not $image (the version in Cargo.toml): change it there" >&2
	exit 1
fi
mkdir -p "$(dirname "$out")"
{
	cat <<EOF
# edra $version for k3s, generated from config/ by packaging/build-k3s-manifest.sh: copy it
# to /var/lib/rancher/k3s/server/manifests/ on a server, and
# edra-$version-<amd64|arm64>.oci.tar.zst to /var/lib/rancher/k3s/agent/images/ on every
# GPU node (docs/operations.md, "k3s, air-gapped, as a DaemonSet"). The DaemonSet runs on
# nodes labelled gpu.edra.dev/present=true or feature.node.kubernetes.io/pci-10de.present=true.
EOF
	for f in daemonset.yaml rbac.yaml admission-policy.yaml "$classes"; do
		printf '\n# ---------- config/%s ----------\n' "$f"
		cat "config/$f"
	done
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "manifest: $out ($(stat -c %s "$out") bytes, image $image)"
