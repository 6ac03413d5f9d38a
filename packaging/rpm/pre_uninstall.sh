# edra %preun ($1: 0 = erase, 1 = upgrade). On erase, stop and disable the agent and
# remove the kubelet's sockets (systemd's fd store keeps them across restarts, so their
# files outlive a stop; without edra they go, so the kubelet drops the driver); on upgrade
# leave it running, %post of the new package restarts it.
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
	systemctl --no-reload disable --now edra.service >/dev/null 2>&1 || :
fi
if [ "$1" -eq 0 ]; then
	for s in /var/lib/kubelet/plugins_registry/gpu.edra.dev-reg.sock /var/lib/kubelet/plugins/gpu.edra.dev/dra.sock; do
		if [ -S "$s" ]; then rm -f "$s"; fi
	done
fi
