# edra %post ($1: 1 = install, 2 = upgrade). The unit is installed disabled and not
# started (an unconfigured node must not join the cluster); an upgrade restarts an agent
# that is already running, without waiting for it (--no-block: the package manager never
# waits on edra; its kubelet sockets stay open across the restart in systemd's fd store). No `systemctl preset`: a distribution preset of "enable *"
# would start an unconfigured agent at the next boot.
if [ -d /run/systemd/system ]; then
	systemd-tmpfiles --create edra.conf >/dev/null 2>&1 || :
	systemctl daemon-reload >/dev/null 2>&1 || :
	if [ "$1" -ge 2 ]; then
		systemctl --no-block try-restart edra.service >/dev/null 2>&1 || :
	fi
fi
