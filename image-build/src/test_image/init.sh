#!/bin/busybox sh
# /init of the vmdeploy test OS (vmdeploy-image-build test-image, image-build/src/test_image/).
# Loads the disk and ext4 modules, finds the root file system by the UUID of `root=UUID=` on the
# kernel command line, mounts it read-only, checks /etc/vmdeploy-test-os and prints one line on
# the console:
#   VMDEPLOY-TEST-OS lockdown: <the kernel's lockdown modes, the active one in brackets>
#   VMDEPLOY-TEST-OS booted root=<UUID read from the mounted file system's superblock>
#   VMDEPLOY-TEST-OS failed: <reason>
# then idles (PID 1 must not exit), or powers off with vmdeploy_test_os.poweroff=1.
# vmdeploy_test_os.wait=N: seconds to wait for the root device (default 10).
/bin/busybox mkdir -p /bin /proc /sys /dev /root
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null

poweroff_after=0
wait_secs=10
uuid=
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    root=UUID=*) uuid="${arg#root=UUID=}" ;;
    vmdeploy_test_os.poweroff=1) poweroff_after=1 ;;
    vmdeploy_test_os.wait=*) wait_secs="${arg#vmdeploy_test_os.wait=}" ;;
  esac
done

finish() {
  if [ "$poweroff_after" = 1 ]; then
    sync
    poweroff -f
  fi
  while :; do sleep 3600; done
}
# Each line starts on a fresh line: GRUB leaves its screen-clearing escapes on the current one.
fail() {
  printf '\n%s\n' "VMDEPLOY-TEST-OS failed: $*" > /dev/console
  finish
}

# Modules in dependency order (image-build's module list format: path [params]). A module that
# is already there or has no hardware (crc32c-intel without SSE4.2) fails harmlessly.
release="$(uname -r)"
while read -r path params; do
  case "$path" in '' | '#'*) continue ;; esac
  insmod "/lib/modules/$release/$path" $params 2>/dev/null
done < /etc/vmdeploy/modules

[ -n "$uuid" ] || fail "no root=UUID= on the kernel command line"
# The disk shows up asynchronously after its driver loaded: poll.
dev=
tries=$((wait_secs * 10))
while [ "$tries" -gt 0 ]; do
  dev="$(findfs "UUID=$uuid" 2>/dev/null)" && break
  dev=
  tries=$((tries - 1))
  sleep 0.1
done
[ -n "$dev" ] || fail "no file system with UUID $uuid (block devices: $(ls /sys/class/block | tr '\n' ' '))"
mount -t ext4 -o ro "$dev" /root || fail "mounting $dev (UUID $uuid) read-only as ext4 failed"
[ "$(cat /root/etc/vmdeploy-test-os 2>/dev/null)" = "@MARKER_TEXT@" ] ||
  fail "/root/etc/vmdeploy-test-os on $dev is missing or does not hold the test OS text"

# The UUID of what is mounted, read from its superblock (s_uuid, 16 bytes at 1024 + 0x68),
# after checking the ext4 magic (0xEF53 at 1024 + 0x38).
mounted="$(awk '$2 == "/root" { print $1 }' /proc/mounts)"
[ "$(od -An -tx1 -j1080 -N2 "$mounted" | tr -d ' \n')" = "53ef" ] ||
  fail "$mounted mounted on /root has no ext4 superblock"
hex="$(od -An -tx1 -j1128 -N16 "$mounted" | tr -d ' \n')"
root_uuid="$(echo "$hex" | sed 's/^\(.\{8\}\)\(.\{4\}\)\(.\{4\}\)\(.\{4\}\)/\1-\2-\3-\4-/')"
# The kernel's lockdown mode: `[integrity]` when it booted under UEFI Secure Boot (Debian's
# kernel locks itself down then), `[none]` otherwise; the Secure Boot deploy test reads it.
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
lockdown="$(cat /sys/kernel/security/lockdown 2>/dev/null || echo unknown)"
printf '\n%s\n' "VMDEPLOY-TEST-OS lockdown: $lockdown" > /dev/console
printf '\n%s\n' "VMDEPLOY-TEST-OS booted root=$root_uuid" > /dev/console
finish
