#!/bin/bash
# rootfs.sh SUITE MIRROR DEST [SNAP_CONFINE]
#
# Builds a Debian root filesystem that boots under systemd-nspawn (without a
# host systemd) and runs a real snapd. The result is written to DEST, which
# must not exist yet. run.sh caches DEST keyed by a hash of this file, the
# arguments and the architecture, so any change here rebuilds the cache.
#
# SUITE: bookworm (snapd 2.57.6), trixie (2.68.3), or sid: a trixie root
# filesystem with only snapd from sid (2.77.1 as of 2026-12), sid pinned low.
# SNAP_CONFINE (sid only): "packaged" keeps sid's snap-confine; "setuid"
# (for machines whose capability bounding set lacks cap_sys_resource, which
# sid's file-capability snap-confine demands) puts trixie's setuid
# snap-confine in its place. snapd, snap and snapctl stay sid's.
#
# Each step below answers a blocker measured on these machines; see
# integration/README.md ("Why each step").
set -euo pipefail

suite=$1 mirror=$2 dest=$3 confine=${4:-packaged}
[ ! -e "$dest" ] || { echo "rootfs.sh: $dest already exists" >&2; exit 1; }
base=$suite
case "$suite" in
bookworm | trixie) ;;
sid) base=trixie ;;
*) echo "rootfs.sh: unknown suite $suite" >&2; exit 2 ;;
esac
case "$confine" in packaged | setuid) ;; *) echo "rootfs.sh: bad SNAP_CONFINE $confine" >&2; exit 2 ;; esac

log() { printf '[rootfs %s] %s\n' "$(date +%T)" "$*" >&2; }

mounted=()
cleanup() {
	local i
	for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
		umount -l "${mounted[i]}" 2>/dev/null || true
	done
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

log "debootstrap $base (minbase) from the host's apt mirror"
# snapd cannot go into --include: debootstrap's resolver fails on its
# "default-dbus-session-bus | dbus-session-bus" dependency.
debootstrap --variant=minbase \
	--include=systemd,systemd-sysv,dbus,dbus-user-session,udev,ca-certificates \
	"$base" "$dest" "$mirror" >"$dest.debootstrap.log" 2>&1 || {
	tail -n 30 "$dest.debootstrap.log" >&2
	exit 1
}
rm -f "$dest.debootstrap.log"

mount -t proc proc "$dest/proc" && mounted+=("$dest/proc")
mount --bind /dev "$dest/dev" && mounted+=("$dest/dev")

# Keep package scripts from starting daemons in the chroot.
printf '#!/bin/sh\nexit 101\n' >"$dest/usr/sbin/policy-rc.d"
chmod 755 "$dest/usr/sbin/policy-rc.d"

apt=(chroot "$dest" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Languages=none -o Acquire::Retries=3)
snapd=snapd
if [ "$suite" = sid ]; then
	# sid next to trixie, pinned below trixie (500) so that only what is
	# asked for by name comes from it. The mirror may be a snapshot whose
	# sid Release file has expired: do not check Valid-Until.
	echo "deb $mirror sid main" >"$dest/etc/apt/sources.list.d/sid.list"
	printf 'Package: *\nPin: release n=sid\nPin-Priority: 100\n' >"$dest/etc/apt/preferences.d/sid-low"
	apt+=(-o Acquire::Check-Valid-Until=false)
	snapd=snapd/sid
fi
log "apt-get install $snapd (no recommends)"
"${apt[@]}" -qq update
"${apt[@]}" -qq -y install --no-install-recommends \
	"$snapd" squashfs-tools squashfuse fuse3 busybox-static >/dev/null
if [ "$confine" = setuid ]; then
	# sid's snap-confine carries file capabilities (cap_sys_resource among
	# them) instead of the setuid bit; where the bounding set lacks one,
	# every service fails "snap-confine is packaged without necessary
	# permissions". trixie's snap-confine is setuid root and works with
	# sid's snapd.
	log "swap in trixie's setuid snap-confine"
	mkdir -p "$dest/root/snapd-trixie"
	chroot "$dest" sh -c 'cd /root/snapd-trixie &&
		apt-get -o Acquire::Retries=3 -o APT::Sandbox::User=root -qq download snapd/trixie'
	chroot "$dest" sh -c 'dpkg-deb -x /root/snapd-trixie/snapd_*.deb /root/snapd-trixie/x &&
		install -m 4755 -o root -g root /root/snapd-trixie/x/usr/lib/snapd/snap-confine /usr/lib/snapd/snap-confine'
	sed -n 's/^VERSION=/snap-confine from snapd /p' "$dest/root/snapd-trixie/x/usr/lib/snapd/info" \
		>"$dest/usr/lib/snapd/snap-confine.snapsvc"
	rm -rf "$dest/root/snapd-trixie"
fi
"${apt[@]}" clean
rm -f "$dest/usr/sbin/policy-rc.d"

# systemd-udevd cannot run in the container (read-only /sys), so snapd's
# "udevadm control --reload-rules" / "udevadm trigger" would fail setup-profiles.
mkdir -p "$dest/usr/local/sbin"
cat >"$dest/usr/local/sbin/udevadm" <<'W'
#!/bin/sh
# snapsvc harness: udevd does not run in this container.
case "$1" in
control | trigger | settle) exit 0 ;;
esac
exec /bin/udevadm "$@"
W
chmod 755 "$dest/usr/local/sbin/udevadm"

# nspawn mounts the cgroup v1 controllers read-only; snap-confine must create
# snap.NAME hierarchies in them. A *bind* remount works even once the
# hierarchy has children (a superblock remount gives EBUSY).
cat >"$dest/etc/systemd/system/snapsvc-cgroup-rw.service" <<'U'
[Unit]
Description=snapsvc harness: make cgroup v1 controllers writable for snap-confine
DefaultDependencies=no
Before=snapd.service snapd.socket
After=local-fs.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'for c in freezer devices pids; do if mountpoint -q /sys/fs/cgroup/$c; then mount -o remount,bind,rw /sys/fs/cgroup/$c; fi; done'

[Install]
WantedBy=sysinit.target snapd.service
U
mkdir -p "$dest/etc/systemd/system/sysinit.target.wants" "$dest/etc/systemd/system/snapd.service.wants"
ln -sf ../snapsvc-cgroup-rw.service "$dest/etc/systemd/system/sysinit.target.wants/"
ln -sf ../snapsvc-cgroup-rw.service "$dest/etc/systemd/system/snapd.service.wants/"

# No getty on the (passive) console; nothing else we need is on it.
ln -sf /dev/null "$dest/etc/systemd/system/console-getty.service"
echo snapsvc-realsnapd >"$dest/etc/hostname"

# Snaps that do not depend on the code under test are packed once, here.
# No store: a base other than "core" needs the snapd snap installed first,
# so a placeholder snapd snap carries only usr/lib/snapd/info.
log "pack placeholder snapd snap and tiny base snap"
work=$dest/root/snapsvc-build
mkdir -p "$work/snapd/meta" "$work/snapd/usr/lib/snapd" "$work/base/meta" "$dest/root/snaps"
cp "$dest/usr/lib/snapd/info" "$work/snapd/usr/lib/snapd/info"
# snap-confine may mount the snapd snap's usr/lib/snapd inside snaps; carry
# snapctl (a static Go binary) so apps and hooks can run it either way.
cp "$dest/usr/lib/snapd/snapctl" "$work/snapd/usr/lib/snapd/snapctl"
ver=$(sed -n 's/^VERSION=//p' "$dest/usr/lib/snapd/info")
cat >"$work/snapd/meta/snap.yaml" <<Y
name: snapd
version: '${ver//[^0-9A-Za-z.+~-]/}'
summary: placeholder snapd snap (snapsvc test harness)
description: Carries only usr/lib/snapd/info so that no store is needed.
type: snapd
grade: devel
confinement: strict
Y

# The base: static busybox plus the mount points snap-confine binds.
for d in bin usr/bin usr/lib/snapd usr/src usr/sbin sbin lib lib64 lib/modules lib/firmware \
	dev etc home root proc sys tmp run media mnt snap var/snap var/lib/snapd var/tmp var/log \
	var/lib/extrausers writable; do
	mkdir -p "$work/base/$d"
done
cp "$dest/bin/busybox" "$work/base/bin/busybox"
for a in $(chroot "$dest" /bin/busybox --list); do
	[ "$a" = busybox ] || ln -sf busybox "$work/base/bin/$a"
done
ln -sf ../lib/snapd/snapctl "$work/base/usr/bin/snapctl"
touch "$work/base/etc/passwd" "$work/base/etc/group" "$work/base/etc/nsswitch.conf"
cat >"$work/base/meta/snap.yaml" <<'Y'
name: tinybase
version: '1'
summary: minimal busybox base (snapsvc test harness)
description: Static busybox and the directories snap-confine mounts over.
type: base
grade: devel
confinement: strict
Y
chroot "$dest" env SNAPPY_GLOBAL_ROOT=/nonexistent snap pack /root/snapsvc-build/snapd /root/snaps >/dev/null
chroot "$dest" env SNAPPY_GLOBAL_ROOT=/nonexistent snap pack /root/snapsvc-build/base /root/snaps >/dev/null
rm -rf "$work"
cleanup
mounted=()
log "done: $(ls "$dest/root/snaps" | tr '\n' ' ')"
