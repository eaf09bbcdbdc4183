#!/usr/bin/env sh
# Builds the static runner and the image eggtimer:<version> from scratch around it: the same as
#   cargo xtask dist                 # with podman, or CONTAINER=docker
# which says first what this machine lacks (the musl target, musl-tools, podman or docker).
# `--redis-image` also makes a Redis image from this machine's redis-server (no registry needed).
set -eu
cd "$(dirname "$0")/../.."
exec cargo xtask dist "$@"
