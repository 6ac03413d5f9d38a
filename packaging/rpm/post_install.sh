# edra %post ($1: 1 = install, 2 = upgrade). The unit is installed disabled and not
# started (an unconfigured node must not join the cluster); an upgrade restarts an agent
# that is already running. No `systemctl preset`: a distribution preset of "enable *"
# would start an unconfigured agent at the next boot.
if [ -d /run/systemd/system ]; then
	systemd-tmpfiles --create edra.conf >/dev/null 2>&1 || :
	systemctl daemon-reload >/dev/null 2>&1 || :
	if [ "$1" -ge 2 ]; then
		systemctl try-restart edra.service >/dev/null 2>&1 || :
	fi
fi
