# edra %preun ($1: 0 = erase, 1 = upgrade). On erase, stop and disable the agent; on
# upgrade leave it running, %post of the new package restarts it.
if [ "$1" -eq 0 ] && [ -d /run/systemd/system ]; then
	systemctl --no-reload disable --now edra.service >/dev/null 2>&1 || :
fi
