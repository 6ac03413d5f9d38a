# edra %postun ($1: 0 = erase, 1 = upgrade). rpm has no purge: the allocation state in
# /var/lib/edra is kept on erase as on upgrade; delete it by hand to start afresh
# (see operations.md). A modified /etc/edra/config.toml is kept as config.toml.rpmsave.
# On erase the agent's lock files at the packaged configuration's paths go (kubelet
# plugins dir, cdi.dynamic_dir, driver gpu.edra.dev), and edra's kubelet plugin folder
# when nothing else is left in it; nothing else of edra's is touched.
if [ "$1" -eq 0 ]; then
	rm -f /var/lib/kubelet/plugins/gpu.edra.dev/edra.lock /run/cdi/.k8s.gpu.edra.dev.lock
	rmdir /var/lib/kubelet/plugins/gpu.edra.dev 2>/dev/null || :
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
