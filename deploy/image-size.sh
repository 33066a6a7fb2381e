#!/usr/bin/env bash
# Measures what the image (Dockerfile) weighs without a Docker engine: the
# gateway binary built with the Dockerfile's exact go build line, and the
# final stage's root filesystem assembled in a temporary directory from the
# Debian 12 files that gcr.io/distroless/static-debian12 is made of (CA
# certificates, time zones, netbase's /etc/services and /etc/protocols,
# os-release, passwd and group with the nonroot user, their copyright
# files), taken from this machine's packages, plus the binary and
# gateway.toml as the final stage copies them. Prints the binary's size and
# the root filesystem's as a tar and as a gzip-compressed tar (a registry
# stores and a node pulls compressed layers).
#
# An approximation of the base layer: the distroless image is built from
# the same Debian packages, perhaps at other patch versions. Needs Go, tar,
# gzip and Debian's tzdata, ca-certificates and netbase.
#
#   deploy/image-size.sh
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The build stage's go build, with its ENV.
line=$(grep -m1 'RUN go build' Dockerfile)
cmd=${line#RUN }
cmd=${cmd//\$\{VERSION\}/dev}
cmd=${cmd//\/out\//$work/}
CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=readonly sh -c "$cmd"

root="$work/rootfs"
mkdir -p "$root"/{etc/ssl/certs,usr/share,usr/local/bin,etc/tollgate,var/lib/tollgate,home/nonroot,root,tmp}
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
cp -a /usr/share/zoneinfo "$root/usr/share/"
cp /etc/services /etc/protocols "$root/etc/"
cp /usr/lib/os-release "$root/etc/os-release"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' > "$root/etc/group"
for pkg in base-files ca-certificates netbase tzdata; do
  mkdir -p "$root/usr/share/doc/$pkg"
  cp "/usr/share/doc/$pkg/copyright" "$root/usr/share/doc/$pkg/"
done
base_tar=$(tar -C "$root" --owner=0 --group=0 -cf - . | wc -c)
base_gz=$(tar -C "$root" --owner=0 --group=0 -cf - . | gzip -9 | wc -c)

cp "$work/gateway" "$root/usr/local/bin/gateway"
cp gateway.toml "$root/etc/tollgate/gateway.toml"
all_tar=$(tar -C "$root" --owner=0 --group=0 -cf - . | wc -c)
all_gz=$(tar -C "$root" --owner=0 --group=0 -cf - . | gzip -9 | wc -c)

mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "binary:             $(stat -c %s "$work/gateway") bytes ($(mib "$(stat -c %s "$work/gateway")"))"
echo "base layer:         $(mib "$base_tar") as tar, $(mib "$base_gz") gzipped"
echo "image (base + app): $(mib "$all_tar") as tar, $(mib "$all_gz") gzipped"
