#!/usr/bin/env bash
# Checks the contents of an edra .deb: the binary, the systemd unit (installed, not
# enabled), the configuration files registered as conffiles, the manifests, the dashboard
# and alert rules, the docs and the maintainer scripts' upgrade/purge behaviour. Exits 1 listing every problem.
#
#   packaging/check-deb.sh target/debian/edra_0.1.0-1_amd64.deb
set -euo pipefail

if [ $# -ne 1 ]; then
	echo "usage: check-deb.sh FILE.deb" >&2
	exit 64
fi
if [ ! -f "$1" ]; then
	echo "check-deb.sh: $1: file not found (packaging/build-packages.sh prints where it wrote the packages)" >&2
	exit 66
fi
if ! command -v dpkg-deb >/dev/null; then
	echo "check-deb.sh: dpkg-deb is missing: apt-get install dpkg" >&2
	exit 69
fi
deb="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

problems=0
fail() {
	echo "FAIL: $*" >&2
	problems=$((problems + 1))
}

# Paths in the data archive, without the leading "./".
dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's#^\./#/#' >"$work/files"
# Control files: conffiles and maintainer scripts.
mkdir "$work/control"
dpkg-deb --ctrl-tarfile "$deb" | tar -x -C "$work/control"

has_file() { grep -qx "$1" "$work/files"; }

has_file /usr/bin/edra || fail "/usr/bin/edra is missing"
if dpkg-deb -c "$deb" | grep -E ' \./usr/bin/edra$' | grep -qv '^-rwxr-xr-x'; then
	fail "/usr/bin/edra is not mode 0755"
fi
unit=""
for u in /usr/lib/systemd/system/edra.service /lib/systemd/system/edra.service; do
	if has_file "$u"; then unit="$u"; fi
done
[ -n "$unit" ] || fail "the systemd unit edra.service is missing"
has_file /usr/lib/tmpfiles.d/edra.conf || fail "/usr/lib/tmpfiles.d/edra.conf is missing"
if [ -n "$unit" ]; then
	dpkg-deb --fsys-tarfile "$deb" | tar -xO ".$unit" >"$work/unit"
	for line in 'Type=notify' 'ExecStart=/usr/bin/edra run' 'StateDirectory=edra' 'WantedBy=multi-user.target'; do
		grep -qx "$line" "$work/unit" || fail "the unit lacks $line"
	done
fi
has_file /etc/edra/config.toml || fail "/etc/edra/config.toml is missing"
has_file /etc/default/edra || fail "/etc/default/edra is missing"
for m in deviceclasses.yaml deviceclasses-v1beta1.yaml daemonset.yaml rbac.yaml rbac-claim-status-nodes.yaml admission-policy.yaml; do
	has_file "/usr/share/edra/manifests/$m" || fail "manifest $m is missing"
done
[ "$(grep -c '^/usr/share/edra/manifests/examples/.*\.yaml$' "$work/files")" -ge 5 ] ||
	fail "fewer than 5 example manifests"
# The dashboard and the alert rules with their tests (docs/monitoring.md).
for m in edra-dashboard.json edra-alerts.yaml edra-alerts.test.yaml; do
	has_file "/usr/share/edra/monitoring/$m" || fail "monitoring file $m is missing"
done
for d in README.md operations.md building.md configuration.md; do
	has_file "/usr/share/doc/edra/$d" || fail "doc $d is missing"
done

conffiles="$work/control/conffiles"
for c in /etc/edra/config.toml /etc/default/edra; do
	grep -qx "$c" "$conffiles" 2>/dev/null || fail "$c is not listed in conffiles"
done
[ "$(sort "$conffiles" | uniq -d | wc -l)" -eq 0 ] || fail "conffiles lists an entry twice"

# The unit is installed disabled and not started.
postinst="$work/control/postinst"
if [ -f "$postinst" ]; then
	if grep -Eq 'deb-systemd-helper enable|systemctl.*enable' "$postinst" &&
		! grep -q 'was-enabled' "$postinst"; then
		fail "postinst enables edra.service"
	fi
	if grep -Eq 'deb-systemd-invoke (start|\$_dh_action)|systemctl (--system )?start' "$postinst"; then
		fail "postinst starts edra.service"
	fi
	grep -q 'try-restart edra.service' "$postinst" || fail "postinst does not restart a running agent on upgrade"
else
	fail "no postinst"
fi
postrm="$work/control/postrm"
if [ -f "$postrm" ]; then
	grep -Eq 'rm -rf "?(\$\{DPKG_ROOT:-\})?/var/lib/edra' "$postrm" || fail "postrm does not delete /var/lib/edra on purge"
	# Only under purge: removal keeps the state.
	awk '/"\$1" = "purge"/{p=1} /rm -rf .*\/var\/lib\/edra/{ if (!p) bad=1 } END{ exit bad }' "$postrm" ||
		fail "postrm deletes /var/lib/edra outside purge"
else
	fail "no postrm"
fi
for s in postinst prerm postrm; do
	if [ -f "$work/control/$s" ]; then
		sh -n "$work/control/$s" || fail "$s is not valid sh"
		grep -q '#DEBHELPER#' "$work/control/$s" && fail "$s still contains #DEBHELPER#"
	fi
done

dpkg-deb -f "$deb" Depends | grep -q 'libc6' || fail "Depends does not name libc6"

if [ "$problems" -gt 0 ]; then
	echo "$deb: $problems problem(s)" >&2
	exit 1
fi
echo "$deb: ok ($(wc -l <"$work/files") paths; unit $unit; conffiles: $(tr '\n' ' ' <"$conffiles"))"
