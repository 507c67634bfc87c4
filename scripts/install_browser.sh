#!/usr/bin/env bash
# Installs Debian's Chromium for the dashboard's browser tests (Playwright drives it through
# executable_path; Playwright's own browser download cannot work offline).
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then exit 0; fi
if [ "$(id -u)" != "0" ]; then SUDO=sudo; else SUDO=; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
