#!/bin/sh
# Headless Chromium for the HTML report's browser test (tests/e2e/test_html_browser.py):
# Debian's `chromium` package, installed with apt-get when no Chromium is on PATH (sudo
# when not root). Does nothing when one is there. Prints the browser's path.
set -eu

for name in chromium chromium-browser google-chrome google-chrome-stable; do
    if path=$(command -v "$name" 2>/dev/null); then
        echo "$path"
        exit 0
    fi
done

if [ "$(id -u)" -eq 0 ]; then
    SUDO=
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo -n"
else
    echo "install-chromium.sh: chromium is missing and neither root nor sudo is available" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends chromium >&2
command -v chromium
