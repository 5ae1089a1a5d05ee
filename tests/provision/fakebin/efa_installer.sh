#!/bin/sh
# Fake aws-efa-installer 1.47.0 (efa_installer.sh inside aws-efa-installer/): writes the installed-packages
# record, fi_info and the efa kmod under $FAKE_HOST_ROOT and prints the real banners. When a module is loaded
# and $FAKE_HOST_ROOT/fake/rmmod-fails exists, unloading fails and it asks for a reboot, as the real one does.
VERSION=1.47.0
KMOD=3.0.0g
root="$FAKE_HOST_ROOT"
[ "$1" = -y ] || { echo "EFA installer must run with -y here" >&2; exit 2; }
echo 1 >> "$root/fake/installer-runs"
echo "== Installing EFA $VERSION =="
mkdir -p "$root/opt/amazon/efa/bin" "$root/fake"
printf '# EFA installer version: %s\n# Debug packages installed: no\n# Packages installed:\nefa-config\nefa-profile\nlibfabric-aws\nefa\n' "$VERSION" > "$root/opt/amazon/efa_installed_packages"
cp "$(dirname "$0")/fi_info" "$root/opt/amazon/efa/bin/fi_info"
echo "$KMOD" > "$root/fake/efa-kmod"
if [ -f "$root/sys/module/efa/version" ] && [ -f "$root/fake/rmmod-fails" ]; then
  echo "Failed to unload EFA kernel module."
  echo "Reboot is needed!"
  echo "===================================================="
  echo "EFA installation complete."
  echo "- Please reboot to complete the installation."
  exit 0
fi
mkdir -p "$root/sys/module/efa" && echo "$KMOD" > "$root/sys/module/efa/version"
echo "===================================================="
echo "EFA installation complete."
echo "- Please logout/login to complete the installation."
