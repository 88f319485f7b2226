#!/usr/bin/env bash
# The k8s/ checks (tests/k8s) build the overlays with `kubectl kustomize` and start a real
# Prometheus (`promtool` checks its files); this installs Debian's packages when a tool is missing.
# Debian's kubectl is 1.20 (kustomize v2): the overlays are written to build with it and with
# kustomize 5 alike.
set -euo pipefail
packages=()
if ! kubectl kustomize --help >/dev/null 2>&1; then packages+=(kubernetes-client); fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then packages+=(prometheus); fi
if [ "${#packages[@]}" -eq 0 ]; then
  exit 0
fi
echo "installing Debian's ${packages[*]} for the k8s checks" >&2
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
kubectl kustomize --help >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null
