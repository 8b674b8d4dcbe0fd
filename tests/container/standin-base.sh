#!/usr/bin/env bash
# A stand-in for the Dockerfile's base image (python:3.11-slim-bookworm), made from
# Debian's packages, for machines that cannot pull it. The container tests run it
# (as root) only when the engine has no such image and cannot pull it:
#
#   standin-base.sh ENGINE IMAGE LABEL
#
# imports the stand-in into ENGINE (podman or docker) as IMAGE, with LABEL
# (key=value) on it so that a changed recipe is rebuilt.
#
# Debian bookworm's python3 is 3.11, as in the official image; a venv at
# /usr/local puts python and pip where the official image has them. What the
# official slim image leaves out (documentation, manuals, apt's lists and
# downloads) is left out here too.
set -euo pipefail

engine=$1 image=$2 label=$3
root=$(mktemp -d "${TMPDIR:-/tmp}/outbox-relay-standin.XXXXXX")
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root/fs" >&2
chroot "$root/fs" python3 -m venv /usr/local
# pip in the image must trust what pip on this machine trusts (a proxy's own CA, say).
cp /etc/ssl/certs/ca-certificates.crt "$root/fs/etc/ssl/certs/ca-certificates.crt"
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/fs/etc/pip.conf"
rm -rf "$root/fs"/var/cache/apt/archives/*.deb "$root/fs"/var/lib/apt/lists/* \
    "$root/fs"/usr/share/doc/* "$root/fs"/usr/share/man/* "$root/fs"/usr/share/info/* \
    "$root/fs"/usr/share/locale/*

tar -C "$root/fs" -cf "$root/fs.tar" .
"$engine" import \
    --change "LABEL $label" \
    --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$root/fs.tar" "$image" >&2
