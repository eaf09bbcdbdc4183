#!/usr/bin/env sh
# Builds the image eggtimer:<version> from scratch around a static musl binary.
#   ops/container/build.sh            # with podman, or CONTAINER=docker ops/container/build.sh
# Needs the musl target and a musl C compiler (mimalloc and ring are C):
#   rustup target add x86_64-unknown-linux-musl && sudo apt-get install -y musl-tools
set -eu
cd "$(dirname "$0")/../.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' runner/Cargo.toml | head -n 1)
cargo build --release --locked --target x86_64-unknown-linux-musl -p eggtimer
cargo xtask plugins
stage=target/container
rm -rf "$stage"
mkdir -p "$stage/rootfs/plugins" "$stage/rootfs/data"
# without the debug info a release build keeps for backtraces (~200 MB -> ~40 MB)
strip -o "$stage/rootfs/eggtimer" target/x86_64-unknown-linux-musl/release/eggtimer
for p in auto-feed coupon-expiry order-cancel webhook; do
  cp "target/plugins/$p.wasm" "$stage/rootfs/plugins/"
done
cp ops/container/Containerfile "$stage/"
"${CONTAINER:-podman}" build -t "eggtimer:$version" -f "$stage/Containerfile" "$stage"
echo "built eggtimer:$version"
