#!/usr/bin/env bash
# Checks the contents of an edra .rpm (needs the rpm tool): the binary, the systemd unit,
# the configuration files marked %config(noreplace), the manifests, the dashboard and
# alert rules, the docs, a glibc requirement, and scriptlets that neither enable nor start
# the unit on install but restart it on upgrade. Exits 1 listing every problem.
#
#   packaging/check-rpm.sh target/generate-rpm/edra-0.1.0-1.x86_64.rpm
set -euo pipefail

if [ $# -ne 1 ]; then
	echo "usage: check-rpm.sh FILE.rpm" >&2
	exit 64
fi
if [ ! -f "$1" ]; then
	echo "check-rpm.sh: $1: file not found (packaging/build-packages.sh prints where it wrote the packages)" >&2
	exit 66
fi
if ! command -v rpm >/dev/null; then
	echo "check-rpm.sh: the rpm tool is missing: apt-get install rpm (Debian, Ubuntu) or dnf install rpm" >&2
	exit 69
fi
rpm="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

problems=0
fail() {
	echo "FAIL: $*" >&2
	problems=$((problems + 1))
}

# "<flags> <mode> <path>" per file; flags: c = %config, n = noreplace, d = %doc.
rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILEMODES:perms} %{FILENAMES}\n]' "$rpm" >"$work/files"
# Scriptlet commands, without comments.
rpm -qp --scripts "$rpm" | grep -v '^[[:space:]]*#' >"$work/scripts"

line_for() { awk -v p="$1" '$NF == p' "$work/files"; }
has_file() { [ -n "$(line_for "$1")" ]; }

line_for /usr/bin/edra | grep -q -- '-rwxr-xr-x' || fail "/usr/bin/edra is missing or not mode 0755"
has_file /usr/lib/systemd/system/edra.service || fail "the systemd unit is missing"
has_file /usr/lib/tmpfiles.d/edra.conf || fail "/usr/lib/tmpfiles.d/edra.conf is missing"
for c in /etc/edra/config.toml /etc/sysconfig/edra; do
	line_for "$c" | grep -q '^cn ' || fail "$c is not %config(noreplace)"
done
for m in deviceclasses.yaml deviceclasses-v1beta1.yaml daemonset.yaml rbac.yaml rbac-claim-status-nodes.yaml admission-policy.yaml; do
	has_file "/usr/share/edra/manifests/$m" || fail "manifest $m is missing"
done
[ "$(grep -c ' /usr/share/edra/manifests/examples/.*\.yaml$' "$work/files")" -ge 5 ] ||
	fail "fewer than 5 example manifests"
# The dashboard and the alert rules with their tests (docs/monitoring.md).
for m in edra-dashboard.json edra-alerts.yaml edra-alerts.test.yaml; do
	has_file "/usr/share/edra/monitoring/$m" || fail "monitoring file $m is missing"
done
for d in README.md operations.md building.md configuration.md; do
	line_for "/usr/share/doc/edra/$d" | grep -q '^d' || fail "doc $d is missing or not %doc"
done
rpm -qp --requires "$rpm" | grep -q '^glibc >= 2\.' || fail "no glibc requirement"

grep -q 'try-restart edra.service' "$work/scripts" || fail "no restart of a running agent on upgrade"
if grep -Eq 'systemctl (--no-reload )?(enable|preset|start)' "$work/scripts"; then
	fail "a scriptlet enables, presets or starts edra.service"
fi
grep -q 'disable --now edra.service' "$work/scripts" || fail "erase does not stop and disable edra.service"
grep -q '/var/lib/edra' "$work/scripts" && grep -q 'rm -rf' "$work/scripts" && fail "a scriptlet deletes state"

if [ "$problems" -gt 0 ]; then
	echo "$rpm: $problems problem(s)" >&2
	exit 1
fi
echo "$rpm: ok ($(wc -l <"$work/files") files)"
