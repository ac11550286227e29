#!/usr/bin/env bash
# Installs the Debian packages a make target needs, when they are missing.
# Usage: scripts/system-deps.sh test|demo|desktop
#   demo: util-linux (unshare, setpriv: the grader's sandbox) and the desktop packages below
#   desktop: the desktop environment's X server, window manager, accessibility
#         bus, LibreOffice, GIMP, VLC, Thunderbird, Chromium (OSWorld's Chrome tasks;
#         also the headless check of the run report) with socat, editor and terminal,
#         and Debian's Python with pyatspi
#   test: the above, redis-server and redis-tools (the Redis tier's service tests
#         start their own servers)
# As root with apt-get it installs them; otherwise it stops with one line naming
# the packages and the command to run. Set SKIP_SYSTEM_DEPS=1 to skip.
set -euo pipefail
target="${1:-test}"
[ "${SKIP_SYSTEM_DEPS:-0}" = "1" ] && exit 0

need=()
want() { command -v "$1" >/dev/null 2>&1 || need+=("$2"); }
want unshare util-linux
want setpriv util-linux
desktop() {
  want Xvfb xvfb
  want openbox openbox
  want dbus-daemon dbus
  want /usr/libexec/at-spi-bus-launcher at-spi2-core
  want xdotool xdotool
  want wmctrl wmctrl
  want soffice libreoffice-calc
  want lowriter libreoffice-writer
  want loimpress libreoffice-impress
  [ -e /usr/lib/libreoffice/program/libvclplug_gtk3lo.so ] || need+=(libreoffice-gtk3)
  want mousepad mousepad
  want xterm xterm
  want gimp gimp
  want vlc vlc
  want thunderbird thunderbird
  want chromium chromium
  want socat socat
  # tools OSWorld's task setups install with sudo apt-get (the desktop's sudo accepts those present)
  want unzip unzip
  want jq jq
  want xsel xsel
  want sar sysstat
  want expect expect
  [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
  /usr/bin/python3 -c 'import pyatspi' >/dev/null 2>&1 || need+=(python3-pyatspi)
  /usr/bin/python3 -c 'import tkinter' >/dev/null 2>&1 || need+=(python3-tk)
  /usr/bin/python3 -c 'import PIL' >/dev/null 2>&1 || need+=(python3-pil)
  /usr/bin/python3 -c 'import ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
}
case "$target" in
  demo) desktop ;;
  desktop) desktop ;;
  test)
    desktop
    want redis-server redis-server
    want redis-cli redis-tools
    ;;
  *) echo "system-deps: unknown target '$target' (use test, demo or desktop)" >&2; exit 2 ;;
esac
[ ${#need[@]} -eq 0 ] && exit 0
# de-duplicate, keep order
mapfile -t need < <(printf '%s\n' "${need[@]}" | awk '!seen[$0]++')
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: installing ${need[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  exit 0
fi
echo "system-deps: missing ${need[*]}; install them with: sudo apt-get install -y ${need[*]} (or set SKIP_SYSTEM_DEPS=1)" >&2
exit 1
