# edra %postun ($1: 0 = erase, 1 = upgrade). rpm has no purge: the allocation state in
# /var/lib/edra is kept on erase as on upgrade; delete it by hand to start afresh
# (see operations.md). A modified /etc/edra/config.toml is kept as config.toml.rpmsave.
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
