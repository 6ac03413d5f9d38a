#!/usr/bin/env python3
"""Writes edra's image archive: one uncompressed tar that is both an OCI image layout
(oci-layout, index.json, blobs/sha256/...) and a docker archive (manifest.json naming the
same blobs), so `ctr images import` (and k3s's images folder), `podman load` and
`docker load` all take it. Called by packaging/build-image.sh, which checks the inputs.

The image has one layer: the files given with --file and --link (and their folders), owned
by root, every mtime SOURCE_DATE_EPOCH, in sorted order; the archive's own entries too. The
same inputs give the same bytes, so the same digests.

  oci-image.py --out edra.tar --name localhost/edra:0.1.0 --arch amd64 --epoch 1700000000 \\
      --file usr/bin/edra=target/.../edra:755 --link lib64/ld-linux-x86-64.so.2=/lib/... \\
      --label org.opencontainers.image.version=0.1.0 --entrypoint /usr/bin/edra --cmd run
"""
import argparse
import hashlib
import io
import json
import sys
import tarfile
import time

# Debian's architecture names are the OCI ones; arm64 images carry variant v8.
VARIANTS = {"amd64": None, "arm64": "v8"}


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def entry(name, epoch, kind=tarfile.REGTYPE, mode=0o644, size=0, target=""):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, target
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = epoch
    return info


def layer_tar(files, links, epoch):
    """The layer: {path: (bytes, mode)} and {path: target}, with every parent folder."""
    paths = set(files) | set(links)
    dirs = set()
    for p in paths:
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    clash = dirs & paths
    if clash:
        sys.exit(f"oci-image.py: {sorted(clash)[0]} is both a folder and a file or link")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for p in sorted(dirs | paths):
            if p in dirs:
                tar.addfile(entry(p + "/", epoch, tarfile.DIRTYPE, 0o755))
            elif p in links:
                tar.addfile(entry(p, epoch, tarfile.SYMTYPE, 0o777, target=links[p]))
            else:
                data, mode = files[p]
                tar.addfile(entry(p, epoch, mode=mode, size=len(data)), io.BytesIO(data))
    return buf.getvalue()


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True, help="full image reference, e.g. localhost/edra:0.1.0")
    ap.add_argument("--arch", required=True, choices=sorted(VARIANTS))
    ap.add_argument("--epoch", required=True, type=int, help="SOURCE_DATE_EPOCH")
    ap.add_argument("--file", action="append", default=[], help="PATH=SOURCE:MODE (octal)")
    ap.add_argument("--link", action="append", default=[], help="PATH=TARGET")
    ap.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    return ap.parse_args()


def main():
    a = parse_args()
    if a.epoch < 0:
        sys.exit("oci-image.py: --epoch must not be negative")
    files, links = {}, {}
    for f in a.file:
        path, _, rest = f.partition("=")
        source, _, mode = rest.rpartition(":")
        with open(source, "rb") as fh:
            files[path.strip("/")] = (fh.read(), int(mode, 8))
    for link in a.link:
        path, _, target = link.partition("=")
        links[path.strip("/")] = target
    layer = layer_tar(files, links, a.epoch)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(a.epoch))
    labels = dict(label.split("=", 1) for label in a.label)
    config = {
        "created": created,
        "architecture": a.arch,
        "os": "linux",
        "config": {
            "Env": a.env,
            "Entrypoint": a.entrypoint,
            "Cmd": a.cmd,
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(layer)]},
        "history": [{"created": created, "created_by": "packaging/build-image.sh"}],
    }
    if VARIANTS[a.arch]:
        config["variant"] = VARIANTS[a.arch]
    config = canonical(config)
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(layer), "size": len(layer)}],
        "annotations": {k: v for k, v in labels.items() if k.startswith("org.opencontainers.image.")},
    })
    platform = {"architecture": a.arch, "os": "linux"}
    if VARIANTS[a.arch]:
        platform["variant"] = VARIANTS[a.arch]
    # containerd names the image after io.containerd.image.name; podman and skopeo after
    # org.opencontainers.image.ref.name; both hold the full reference.
    index = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest),
            "size": len(manifest),
            "platform": platform,
            "annotations": {"io.containerd.image.name": a.name, "org.opencontainers.image.ref.name": a.name},
        }],
    })
    blob = lambda data: "blobs/sha256/" + digest(data)[len("sha256:"):]
    docker = canonical([{"Config": blob(config), "RepoTags": [a.name], "Layers": [blob(layer)]}])
    with open(a.out, "wb") as out, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for d in ["blobs/", "blobs/sha256/"]:
            tar.addfile(entry(d, a.epoch, tarfile.DIRTYPE, 0o755))
        for data in sorted([layer, config, manifest], key=digest):
            tar.addfile(entry(blob(data), a.epoch, size=len(data)), io.BytesIO(data))
        for name, data in [("index.json", index), ("manifest.json", docker), ("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))]:
            tar.addfile(entry(name, a.epoch, size=len(data)), io.BytesIO(data))
    print(f"image {a.name} {a.arch}: manifest {digest(manifest)}, layer {len(layer)} bytes")


if __name__ == "__main__":
    main()
