#!/usr/bin/env bash
# Installs Debian's Chromium where the dashboard's browser tests launch it (Playwright drives
# it through executable_path; Playwright's own browser download cannot work offline):
# ${DRAFTCTL_CHROMIUM:-/usr/bin/chromium}, as in tests/dashboard/conftest.py. Another chromium
# on PATH does not count: the tests would not find it, skip, and in CI (tests/ci_skips.py) fail.
set -euo pipefail
CHROMIUM="${DRAFTCTL_CHROMIUM:-/usr/bin/chromium}"

check() {
    if ! "$CHROMIUM" --headless --no-sandbox --version >/dev/null 2>&1; then
        echo "install_browser.sh: $CHROMIUM does not run ('$CHROMIUM --version' failed)" >&2
        exit 1
    fi
}

if [ -x "$CHROMIUM" ]; then check; exit 0; fi
if [ -n "${DRAFTCTL_CHROMIUM:-}" ]; then
    echo "install_browser.sh: DRAFTCTL_CHROMIUM=$CHROMIUM is not an executable file" >&2
    exit 1
fi
if [ "$(id -u)" != "0" ]; then SUDO=sudo; else SUDO=; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
if [ ! -x "$CHROMIUM" ]; then
    echo "install_browser.sh: apt installed chromium, but $CHROMIUM is missing" >&2
    exit 1
fi
check
