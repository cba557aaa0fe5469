#!/usr/bin/env bash
# deps.sh — installs what building and testing attn needs and this machine lacks:
# a C compiler with OpenMP (gcc), make and pkg-config, from Debian's packages.
# Idempotent and quiet when everything is there already.
set -eu
missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
