#!/bin/bash
# integration/run.sh — run snapsvc's integration suite against a REAL snapd.
#
# Boots Debian's snapd (real systemd, snap-confine and service processes) in a
# systemd-nspawn container from a cached root filesystem, installs the svcdemo
# test snap, and runs the Go tests tagged `realsnapd` inside snapd's PID
# namespace. Always tears the container down (trap on EXIT/INT/TERM).
#
# Needs root. Environment:
#   SNAPSVC_REALSNAPD        Debian suite: bookworm (snapd 2.57.6, default), trixie
#                            (snapd 2.68.3, has notices) or sid (a trixie rootfs with
#                            sid's snapd, 2.77.1); "all" runs the three in turn.
#   SNAPSVC_SLOW_SECONDS     how long gamma's stop, slowstart's start take (default 3)
#   SNAPSVC_REALSNAPD_CACHE  rootfs cache (default /var/cache/snapsvc-realsnapd)
#   SNAPSVC_REALSNAPD_LOGS   where logs go (default /var/tmp/snapsvc-realsnapd-logs/SUITE)
#   SNAPSVC_REALSNAPD_RUN    passed to -test.run (default: all tests)
#   SNAPSVC_REALSNAPD_KEEP=1 after the tests, keep the container up until Enter is pressed
#   SNAPSVC_REALSNAPD_LOCK_WAIT  seconds to wait for another run to finish (default 7200)
#   SNAPSVC_REALSNAPD_DEBS   a directory with the release's .deb packages (.ci/release's
#                            output, as .ci/run builds it); without it run.sh builds them
#                            for this machine's architecture. After the tests they are
#                            installed in the container and the installed snapsvc is run
#                            against its snapd.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
suite=${SNAPSVC_REALSNAPD:-bookworm}
slow=${SNAPSVC_SLOW_SECONDS:-3}
cache=${SNAPSVC_REALSNAPD_CACHE:-/var/cache/snapsvc-realsnapd}
state=/run/snapsvc-realsnapd

# build_debs DIR: the release's packages for this machine's architecture,
# from .ci/release's one definition (.ci/release/release.yaml).
build_debs() {
	(cd "$repo/.ci/release" && GOWORK=off PATH=$PATH:/usr/local/go/bin go run . -repo "$repo" -out "$1" -targets "linux/$(PATH=$PATH:/usr/local/go/bin go env GOARCH)")
}

suites='bookworm trixie sid'
if [ "$suite" = all ]; then
	failed='' passed=''
	if [ -z "${SNAPSVC_REALSNAPD_DEBS:-}" ]; then
		# Built once for the three suites.
		debs_tmp=$(mktemp -d /var/tmp/snapsvc-debs.XXXXXX)
		trap 'rm -rf "$debs_tmp"' EXIT
		build_debs "$debs_tmp/dist" || { echo "run.sh: building the release packages failed" >&2; exit 1; }
		export SNAPSVC_REALSNAPD_DEBS=$debs_tmp/dist
	fi
	for s in $suites; do
		s0=$(date +%s)
		if SNAPSVC_REALSNAPD=$s "$0" "$@"; then
			passed="$passed $s($(($(date +%s) - s0))s)"
		else
			failed="$failed $s"
		fi
	done
	[ -z "$failed" ] || { echo "run.sh: real-snapd suite failed on:$failed (passed:${passed:- none})" >&2; exit 1; }
	echo "run.sh: real-snapd suite passed on:$passed"
	exit 0
fi
case " $suites " in *" $suite "*) ;; *)
	echo "run.sh: SNAPSVC_REALSNAPD must be one of $suites or all (got $suite)" >&2
	exit 2
	;;
esac
[ "$(id -u)" -eq 0 ] || { echo "run.sh: needs root (systemd-nspawn, mounts)" >&2; exit 2; }
export PATH=$PATH:/usr/local/go/bin:/usr/sbin:/sbin

logs=${SNAPSVC_REALSNAPD_LOGS:-/var/tmp/snapsvc-realsnapd-logs/$suite}
t0=$(date +%s)
say() { printf '[realsnapd %s +%3ss] %s\n' "$suite" "$(($(date +%s) - t0))" "$*"; }
die() { say "FAILED: $*" >&2; exit 1; }

# until_ok SECONDS DESCRIPTION CMD...: retry CMD every 0.5 s until it succeeds.
until_ok() {
	local limit=$1 what=$2 end
	shift 2
	end=$(($(date +%s) + limit))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$end" ] || die "timed out after ${limit}s waiting for $what"
		sleep 0.5
	done
}

# One container at a time on the machine. Runs queued behind this lock (or
# behind /run/snapsvc-integration.queue, which people take around run.sh)
# wait for it: a whole three-suite run takes minutes.
mkdir -p "$state"
exec 9>"$state/lock"
if ! flock -n 9; then
	lockwait=${SNAPSVC_REALSNAPD_LOCK_WAIT:-7200}
	say "another real-snapd run holds $state/lock; waiting for it (at most ${lockwait}s)"
	flock -w "$lockwait" 9 || die "another real-snapd run still holds $state/lock after ${lockwait}s"
	t0=$(date +%s)
	say "got the lock"
fi

# ---- leftovers of an interrupted earlier run (only what run.sh itself recorded)
stop_nspawn() { # pid
	local pid=$1 i
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
	[ "$(cat "/proc/$pid/comm" 2>/dev/null)" = systemd-nspawn ] || return 0
	kill -TERM "$pid" 2>/dev/null # powers the container off
	for ((i = 0; i < 60; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
	kill -TERM "$pid" 2>/dev/null # a second SIGTERM ends it at once
	for ((i = 0; i < 10; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
	kill -KILL "$pid" 2>/dev/null || true
}
# safe_rm DIR: unmount anything still mounted below DIR (a build cut short
# can leave /proc or a bind of /dev there), then remove it; refuses if a
# mount remains, so a host /dev is never deleted through a bind mount.
safe_rm() {
	local d=$1 m
	[ -e "$d" ] || return 0
	d=$(realpath "$d")
	for m in $(awk -v p="$d/" 'index($2, p) == 1 { print $2 }' /proc/self/mounts | sort -r); do
		umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
	done
	if awk -v p="$d" '$2 == p || index($2, p "/") == 1 { found=1 } END { exit !found }' /proc/self/mounts; then
		echo "run.sh: not removing $d: something is still mounted there" >&2
		return 1
	fi
	rm -rf "$d"
}
unmount_work() { # workdir
	local w=$1
	[ -n "$w" ] || return 0
	if mountpoint -q "$w/root" 2>/dev/null; then
		umount "$w/root" 2>/dev/null || umount -l "$w/root" 2>/dev/null || true
	fi
	safe_rm "$w" || true
}
if [ -s "$state/nspawn.pid" ]; then
	say "stopping a container left by an earlier run (pid $(cat "$state/nspawn.pid"))"
	stop_nspawn "$(cat "$state/nspawn.pid")"
fi
[ ! -s "$state/work" ] || unmount_work "$(cat "$state/work")"
rm -f "$state/nspawn.pid" "$state/work"

# ---- long-running children run in the background in their own process
# group and are waited for, so that a signal reaches run.sh's trap at once
# (bash defers traps while a foreground child runs) and teardown can end
# the whole group.
child=''
wait_child() { # pid: wait for it, streaming its log if it is the test run
	local pid=$1 tailpid='' rc=0
	child=$pid
	if [ -n "${stream:-}" ]; then
		tail -c +"${stream_from:-1}" -f --pid="$pid" "$stream" &
		tailpid=$!
	fi
	wait "$pid" || rc=$?
	[ -z "$tailpid" ] || wait "$tailpid" 2>/dev/null || true
	child=''
	return $rc
}
end_child() {
	[ -n "$child" ] && kill -0 "$child" 2>/dev/null || return 0
	kill -TERM -- "-$child" 2>/dev/null || kill -TERM "$child" 2>/dev/null || true
	sleep 1
	kill -KILL -- "-$child" 2>/dev/null || true
}

# ---- teardown: always, on success, failure or interrupt
nspawn_pid='' leader='' work=''
collect_logs() {
	[ -n "$leader" ] && [ -d "/proc/$leader" ] || return 0
	inside journalctl --no-pager -b -o short-precise >"$logs/journal.txt" 2>&1 || true
	inside snap changes >"$logs/snap-changes.txt" 2>&1 || true
	inside snap services >"$logs/snap-services.txt" 2>&1 || true
	inside systemctl --failed --no-pager >"$logs/failed-units.txt" 2>&1 || true
}
teardown() {
	local rc=$?
	set +e
	trap - EXIT INT TERM
	end_child
	[ -z "${debs_pid:-}" ] || kill -TERM -- "-$debs_pid" 2>/dev/null || true
	if [ $rc -ne 0 ]; then
		collect_logs
		if [ -s "$logs/journal.txt" ]; then
			echo "---- last 80 lines of the container's journal ($logs/journal.txt) ----"
			grep -Ev 'systemd-journald|kernel:' "$logs/journal.txt" | tail -n 80
			echo "---- end of journal ----"
		fi
	fi
	if [ -n "$nspawn_pid" ]; then
		say "teardown: powering off the container"
		stop_nspawn "$nspawn_pid"
	fi
	unmount_work "$work"
	[ -z "${building:-}" ] || { safe_rm "$building"; rm -f "$building.debootstrap.log"; }
	rm -f "$state/nspawn.pid" "$state/work"
	say "teardown done (exit $rc); logs in $logs"
	exit $rc
}
trap teardown EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

rm -rf "$logs"
mkdir -p "$logs"

# ---- host packages
if ! command -v debootstrap >/dev/null || ! command -v systemd-nspawn >/dev/null; then
	say "installing debootstrap and systemd-container on the host"
	apt-get -qq update
	DEBIAN_FRONTEND=noninteractive apt-get -qq -y install --no-install-recommends \
		debootstrap systemd-container >/dev/null
fi

# ---- the Debian mirror this machine's apt uses (never hardcoded)
host_mirror() {
	local f uri
	# deb822 sources: first URI of a stanza whose Suites include the host's codename
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		uri=$(awk -v want="$1" '
			/^[ \t]*$/ { if (uri != "" && hit && types) { print uri; exit } uri=""; hit=0; types=0; next }
			tolower($1) == "types:" { for (i = 2; i <= NF; i++) if ($i == "deb") types=1 }
			tolower($1) == "uris:" { uri=$2 }
			tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == want) hit=1 }
			END { if (uri != "" && hit && types) print uri }' "$f" | sed -n 1p)
		[ -z "$uri" ] || { echo "$uri"; return; }
	done
	# one-line sources
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] || continue
		uri=$(sed -E 's/\[[^]]*\]//' "$f" | awk -v want="$1" '$1 == "deb" && $3 == want { print $2; exit }')
		[ -z "$uri" ] || { echo "$uri"; return; }
	done
}
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
mirror=${SNAPSVC_DEBIAN_MIRROR:-$(host_mirror "$codename")}
[ -n "$mirror" ] || die "cannot find the Debian mirror in /etc/apt/sources.list* (set SNAPSVC_DEBIAN_MIRROR)"

# ---- snap-confine for sid: its packaged snap-confine has file capabilities
# and needs cap_sys_resource (bit 24) in the capability bounding set, which
# some machines drop from every process (this one's container gets the same).
confine=packaged
if [ "$suite" = sid ]; then
	capbnd=$(awk '$1 == "CapBnd:" { print $2 }' /proc/self/status)
	if [ $(((0x$capbnd >> 24) & 1)) -eq 0 ]; then
		confine=setuid
		say "the capability bounding set ($capbnd) lacks cap_sys_resource: using trixie's setuid snap-confine"
	fi
fi

# ---- root filesystem, cached by a hash of the recipe
key=$( (cat "$here/rootfs.sh"; echo "$suite $(uname -m) $confine") | sha256sum | cut -c1-16)
rootfs=$cache/$suite-$key
if [ -f "$rootfs/.snapsvc-ready" ]; then
	say "using cached rootfs $rootfs"
else
	say "building rootfs $rootfs (Debian $suite; not cached yet)"
	mkdir -p "$cache"
	for old in "$cache/$suite-"*; do # older recipes of this suite, or a build cut short
		safe_rm "$old" || die "cannot remove $old"
	done
	building=$rootfs.tmp
	setsid "$here/rootfs.sh" "$suite" "$mirror" "$rootfs.tmp" "$confine" &
	wait_child $! || die "building the rootfs"
	building=
	touch "$rootfs.tmp/.snapsvc-ready"
	mv "$rootfs.tmp" "$rootfs"
	say "rootfs cached ($(du -sh "$rootfs" | cut -f1))"
fi

# ---- build the test binary while the container boots
gobuild() {
	cd "$repo"
	go test -c -tags realsnapd -o "$work/integration.test" ./integration
}
# snapsvc-helper: snapsvc from inside the snap (static: the base is busybox only)
buildhelper() {
	cd "$repo"
	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$work/snapsvc-helper" ./integration/insnap
}

# ---- Debian's snap client on the host, for the snap-client differential
# (the same snapd package version as the container's): apt-get download
# with a private apt state under the cache, unpacked with dpkg-deb -x, never
# installed. Cached per version in $cache/snap-client/VERSION/snap.
snapd_deb=$(dpkg-query --admindir="$rootfs/var/lib/dpkg" -W -f='${Version}' snapd)
snap_client=$cache/snap-client/$snapd_deb/snap
fetch_snap_client() {
	local from=$1 dir=$cache/snap-client/$snapd_deb apt_dir=$cache/apt-host tmp keyring opts
	[ ! -x "$dir/snap" ] || return 0
	rm -rf "$cache/snap-client/.tmp."* # a fetch cut short
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	mkdir -p "$apt_dir/lists-$from/partial" "$apt_dir/cache/archives/partial" "$cache/snap-client"
	if [ -r "$keyring" ]; then
		echo "deb [signed-by=$keyring] $mirror $from main" >"$apt_dir/$from.list"
	else
		echo "deb $mirror $from main" >"$apt_dir/$from.list"
	fi
	opts=(-o "Dir::Etc::SourceList=$apt_dir/$from.list" -o Dir::Etc::SourceParts=/nonexistent
		-o "Dir::State::Lists=$apt_dir/lists-$from" -o "Dir::Cache=$apt_dir/cache"
		-o Acquire::Check-Valid-Until=false -o Acquire::Languages=none -o Acquire::Retries=3
		-o APT::Sandbox::User=root)
	apt-get "${opts[@]}" -qq update
	tmp=$(mktemp -d "$cache/snap-client/.tmp.XXXXXX")
	(cd "$tmp" && apt-get "${opts[@]}" -qq download "snapd=$snapd_deb")
	dpkg-deb -x "$tmp"/snapd_*.deb "$tmp/x"
	# From 2.7x usr/bin/snap links to the multicall snapd binary, which
	# acts as the snap client when called as "snap".
	install -m 755 "$(realpath "$tmp/x/usr/bin/snap")" "$tmp/snap"
	rm -rf "$dir" "$tmp/x" "$tmp"/snapd_*.deb "$apt_dir/lists-$from" "$apt_dir/cache"
	mv "$tmp" "$dir"
}

# ---- a throwaway writable layer over the cached rootfs
work=$(mktemp -d /var/tmp/snapsvc-realsnapd.XXXXXX)
echo "$work" >"$state/work"
mkdir -p "$work/upper" "$work/ovl" "$work/root"
mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$work/upper,workdir=$work/ovl" "$work/root"

# No start rate limit in the container: the tests start the same services
# far more often than any real system would (the bootstrap benchmark starts
# alpha up to six times within a second), and systemd's default of five
# starts in 10 s then fails a start with "start of the service was
# attempted too often", at random, depending on how the calls interleave.
mkdir -p "$work/root/etc/systemd/system.conf.d"
printf '[Manager]\nDefaultStartLimitIntervalSec=0\n' >"$work/root/etc/systemd/system.conf.d/90-snapsvc-no-start-limit.conf"

# The test snap, with the slow durations filled in.
mkdir -p "$work/root/root/svcdemo"
cp -a "$here/snaps/svcdemo/." "$work/root/root/svcdemo/"

# Linux 6.18 hands out mount namespace ids from per-CPU batches, so a newer
# namespace can get a smaller id; the kernel's mnt_ns_loop() check then
# refuses snap-confine's capture of a snap's new mount namespace with EINVAL
# ("cannot preserve mount namespace of process N as svcdemo.mnt: Invalid
# argument"), at random, when two CPUs' batches have diverged (seen about
# once in three runs; fixed in snap-confine by canonical/snapd#17376, which
# Debian's snapd lacks). With the container pinned to one CPU every
# namespace id it allocates increases. SNAPSVC_REALSNAPD_PIN_CPU=0 turns it off.
pin=()
cpu=''
if [ "${SNAPSVC_REALSNAPD_PIN_CPU:-auto}" = 1 ] || { [ "${SNAPSVC_REALSNAPD_PIN_CPU:-auto}" = auto ] && [[ "$(uname -r)" == 6.18.* ]]; }; then
	cpu=$(awk '$1 == "Cpus_allowed_list:" { split($2, a, /[,-]/); print a[1] }' /proc/self/status)
	pin=(taskset -c "$cpu")
	say "kernel $(uname -r): pinning the container to CPU $cpu (mount namespace id ordering)"
fi

say "booting the container"
# --register=no --keep-unit: there is no host systemd/machined to register with.
"${pin[@]}" systemd-nspawn --quiet --register=no --keep-unit --boot -D "$work/root" \
	--machine=snapsvc-realsnapd --console=passive --capability=all --bind=/dev/fuse \
	>"$logs/nspawn.txt" 2>&1 &
nspawn_pid=$!
echo "$nspawn_pid" >"$state/nspawn.pid"

gobuild >"$logs/go-build.txt" 2>&1 &
gobuild_pid=$!
buildhelper >"$logs/go-build-helper.txt" 2>&1 &
helper_pid=$!
fetch_snap_client "$suite" >"$logs/snap-client.txt" 2>&1 &
client_pid=$!
debs=${SNAPSVC_REALSNAPD_DEBS:-}
debs_pid=''
if [ -z "$debs" ]; then
	debs=$work/dist
	setsid bash -c "$(declare -f build_debs); repo='$repo'; build_debs '$debs'" >"$logs/release.txt" 2>&1 &
	debs_pid=$!
fi

# The container's PID 1 (a host pid): nspawn's child whose pid in its own namespace is 1.
find_leader() {
	local c
	for c in $(cat /proc/"$nspawn_pid"/task/*/children 2>/dev/null); do
		if awk '$1 == "NSpid:" && NF == 3 && $3 == 1 { ok=1 } END { exit !ok }' "/proc/$c/status" 2>/dev/null; then
			leader=$c
			return 0
		fi
	done
	kill -0 "$nspawn_pid" 2>/dev/null || die "systemd-nspawn exited: $(tail -n 5 "$logs/nspawn.txt")"
	return 1
}
until_ok 30 "the container's init" find_leader
inside() { "${pin[@]}" nsenter -t "$leader" -a -- "$@"; }
system_up() {
	local s
	s=$(inside systemctl is-system-running 2>/dev/null) || true
	case "$s" in running | degraded) return 0 ;; esac
	kill -0 "$nspawn_pid" 2>/dev/null || die "systemd-nspawn exited: $(tail -n 5 "$logs/nspawn.txt")"
	return 1
}
until_ok 120 "systemd in the container to finish booting" system_up
say "container up (leader pid $leader): $(inside systemctl is-system-running || true)"
until_ok 90 "snapd to answer" inside snap wait system seed.loaded
say "snapd $(inside snap version | awk '$1 == "snapd" { print $2 }') is up"

# ---- install the snaps: placeholder snapd (snapd restarts itself), base, svcdemo
install_snap() { # file
	local out
	out=$(timeout 120 "${pin[@]}" nsenter -t "$leader" -a -- snap install --dangerous "$1" 2>&1) || {
		# snapd restarting itself can cut the client off; the change still completes.
		echo "$out" >>"$logs/snap-install.txt"
		until_ok 60 "snapd to come back" inside snap wait system seed.loaded
		until_ok 60 "the install of $1 to finish" sh -c "! nsenter -t $leader -a -- snap changes 2>/dev/null | grep -qE ' (Do|Doing|Undo|Undoing) '"
		inside snap list "$(basename "$1" | cut -d_ -f1)" >/dev/null || die "snap install $1: $out"
	}
	echo "$out" >>"$logs/snap-install.txt"
}
for f in $(inside sh -c 'ls /root/snaps/snapd_*.snap /root/snaps/tinybase_*.snap'); do
	install_snap "$f"
done
# snap-refresh-observe lets the in-snap helper read changes and notices on
# the snap socket; snapd 2.57 has no such interface (a plug of an unknown
# interface would only add a warning to every response).
plugs='' observe=0
if inside snap interface snap-refresh-observe >/dev/null 2>&1; then plugs=snap-refresh-observe observe=1; fi
sed -e "s/@SLOW_SECONDS@/$slow/" -e "s/@HELPER_PLUGS@/$plugs/" "$here/snaps/svcdemo/meta/snap.yaml.in" \
	>"$work/root/root/svcdemo/meta/snap.yaml"
rm "$work/root/root/svcdemo/meta/snap.yaml.in"
wait "$helper_pid" || { cat "$logs/go-build-helper.txt"; die "go build ./integration/insnap"; }
install -m 755 "$work/snapsvc-helper" "$work/root/root/svcdemo/bin/snapsvc-helper"
# SNAPPY_GLOBAL_ROOT: with the placeholder snapd snap installed, snap pack
# would look for mksquashfs in it.
# lzo: xz takes ~15 s on the helper binary.
inside env SNAPPY_GLOBAL_ROOT=/nonexistent snap pack --compression=lzo /root/svcdemo /root/snaps >>"$logs/snap-install.txt" 2>&1 ||
	die "snap pack svcdemo: $(tail -n 3 "$logs/snap-install.txt")"
# Named as the golden capture had it (the install change's summary shows the path).
inside sh -c "mv /root/snaps/svcdemo_*.snap /root/snaps/svcdemo_1_$(dpkg --print-architecture).snap"
install_snap "/root/snaps/svcdemo_1_$(dpkg --print-architecture).snap"
# A second revision of svcdemo, version 2 (the same apps), for the refresh
# tests: installed over the first with `snap install --dangerous`, it is a
# refresh in all but the change's kind (install-snap). Not installed here.
arch=$(inside dpkg --print-architecture)
inside sh -c "rm -rf /root/svcdemo2 /root/snaps2 && cp -a /root/svcdemo /root/svcdemo2 && mkdir /root/snaps2 &&
	sed -i \"s/^version: .*/version: '2'/\" /root/svcdemo2/meta/snap.yaml &&
	SNAPPY_GLOBAL_ROOT=/nonexistent snap pack --compression=lzo /root/svcdemo2 /root/snaps2 &&
	mv /root/snaps2/svcdemo_2_*.snap /root/snaps/svcdemo_2_$arch.snap && rmdir /root/snaps2" >>"$logs/snap-install.txt" 2>&1 ||
	die "snap pack svcdemo version 2: $(tail -n 3 "$logs/snap-install.txt")"
# The connection is a change of svcdemo; the captures' change histories
# have none, so the conformance replay runs before it (see below).
connect_observe() {
	[ "$observe" = 1 ] || return 0
	inside snap connect svcdemo:snap-refresh-observe >>"$logs/snap-install.txt" 2>&1 || die "snap connect svcdemo:snap-refresh-observe"
}
inside snap services svcdemo | tee "$logs/services-at-start.txt"
say "snaps installed"

wait "$gobuild_pid" || { cat "$logs/go-build.txt"; die "go test -c -tags realsnapd ./integration"; }
wait "$client_pid" || { cat "$logs/snap-client.txt"; die "fetching Debian's snap client (snapd $snapd_deb from $suite)"; }

# ---- run the suite inside snapd's PID namespace (snapd checks the peer's pid)
say "running the realsnapd Go tests"
ver=$(inside snap version | awk '$1 == "snapd" { print $2 }')
: >"$logs/go-test.txt"
run_tests() { # go test flags...
	stream_from=$(($(stat -c %s "$logs/go-test.txt") + 1))
	(cd "$here" && exec setsid timeout --kill-after=10 600 nsenter -t "$leader" -p -- env \
		SNAPSVC_REALSNAPD_SOCKET="/proc/$leader/root/run/snapd.socket" \
		SNAPSVC_REALSNAPD_SNAP_SOCKET="/proc/$leader/root/run/snapd-snap.socket" \
		SNAPSVC_REALSNAPD_COOKIE="/proc/$leader/root/var/lib/snapd/cookie/snap.svcdemo" \
		SNAPSVC_REALSNAPD_SVCDEMO1="/proc/$leader/root/root/snaps/svcdemo_1_$arch.snap" \
		SNAPSVC_REALSNAPD_SVCDEMO2="/proc/$leader/root/root/snaps/svcdemo_2_$arch.snap" \
		SNAPSVC_REALSNAPD_VERSION="$ver" \
		SNAPSVC_REALSNAPD_LEADER="$leader" \
		SNAPSVC_REALSNAPD_OBSERVE="$observe" \
		SNAPSVC_REALSNAPD_SUITE="$suite" \
		SNAPSVC_REALSNAPD_CPU="$cpu" \
		SNAPSVC_SLOW_SECONDS="$slow" \
		SNAPSVC_REALSNAPD_CAPTURE="$logs/responses" \
		SNAPSVC_REALSNAPD_SNAP_CLIENT="$snap_client" \
		SNAPSVC_REALSNAPD_TRANSCRIPTS="$logs/snap-client" \
		"$work/integration.test" -test.v -test.count=1 -test.timeout=8m "$@" >>"$logs/go-test.txt" 2>&1) &
	stream=$logs/go-test.txt
	wait_child $!
}
rc=0
if [ -n "${SNAPSVC_REALSNAPD_RUN:-}" ]; then
	connect_observe
	run_tests -test.run "$SNAPSVC_REALSNAPD_RUN" || rc=$?
else
	# The conformance replay compares change histories with the capture's,
	# so it goes first, on the freshly installed snap.
	run_tests -test.run '^TestConformanceRealSnapd$' || rc=$?
	connect_observe
	run_tests -test.skip '^TestConformanceRealSnapd$' || rc=$?
fi
stream=''

# ---- the release packages, installed in the container: the installed
# snapsvc against this snapd (its version, a restart of svcdemo.alpha, the
# restart's change found with --last)
check_packages() {
	local arch main_before main_after f
	if [ -n "$debs_pid" ]; then
		wait "$debs_pid" || { cat "$logs/release.txt"; say "building the release packages failed"; return 1; }
		say "release packages built: $(cd "$debs" && echo *.deb)"
	fi
	arch=$(inside dpkg --print-architecture)
	mkdir -p "$work/root/root/debs" "$work/root/root/debs-test"
	for f in "$debs"/snapsvc_*_"$arch".deb "$debs"/snapsvc-rollout_*_"$arch".deb; do
		[ -f "$f" ] || { say "no $(basename "$f") in $debs"; return 1; }
		cp "$f" "$work/root/root/debs/"
	done
	f=$(echo "$debs"/snapsvc-fakesnapd_*_"$arch".deb)
	[ -f "$f" ] || { say "no $(basename "$f") in $debs"; return 1; }
	cp "$f" "$work/root/root/debs-test/"
	say "installing in the container: $(cd "$work/root/root/debs" && echo *.deb)"
	inside sh -c 'dpkg -i /root/debs/*.deb' || return 1
	inside dpkg-query -W -f='${Package} ${Version} ${Architecture} Recommends: ${Recommends}\n' snapsvc snapsvc-rollout
	# The operator's packages: no test double in /usr/bin; snapd recommended.
	! inside test -e /usr/bin/fakesnapd || { say "the operator's packages installed /usr/bin/fakesnapd"; return 1; }
	for p in snapsvc snapsvc-rollout; do
		[ "$(inside dpkg-query -W -f='${Recommends}' "$p")" = snapd ] || { say "$p does not recommend snapd"; return 1; }
		# Debian's documents: DEP-5 copyright naming every linked
		# module's licence, a Debian changelog whose first entry is this
		# version.
		inside sh -c "head -1 /usr/share/doc/$p/copyright | grep -qx 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/'" ||
			{ say "$p's copyright is not DEP-5"; return 1; }
		inside sh -c "grep -q '^Files: go-modules/go.etcd.io/etcd/client/v3@\|^Files: go-modules/github.com/spf13/cobra@' /usr/share/doc/$p/copyright" ||
			{ say "$p's copyright names no linked module"; return 1; }
		inside sh -c "zcat /usr/share/doc/$p/changelog.Debian.gz | head -1 | grep -q \"^$p ($(inside dpkg-query -W -f='${Version}' "$p")) \"" ||
			{ say "$p's changelog.Debian.gz does not start with its version"; return 1; }
	done
	say "installing the test double on its own: $(cd "$work/root/root/debs-test" && echo *.deb)"
	inside sh -c 'dpkg -i /root/debs-test/*.deb' || return 1
	for f in /usr/bin/snapsvc /usr/bin/fakesnapd /usr/bin/snapsvc-rollout /usr/share/man/man1/snapsvc.1.gz \
		/usr/share/man/man1/snapsvc-restart.1.gz /usr/share/man/man1/snapsvc-logs.1.gz /usr/share/bash-completion/completions/snapsvc \
		/usr/share/zsh/vendor-completions/_snapsvc /usr/share/fish/vendor_completions.d/snapsvc.fish \
		/usr/share/man/man1/snapsvc-rollout.1.gz /usr/share/man/man1/snapsvc-rollout-status.1.gz \
		/usr/share/man/man1/snapsvc-rollout-pause.1.gz /usr/share/bash-completion/completions/snapsvc-rollout \
		/usr/share/zsh/vendor-completions/_snapsvc-rollout /usr/share/fish/vendor_completions.d/snapsvc-rollout.fish \
		/usr/share/man/man1/fakesnapd.1.gz /usr/share/doc/snapsvc-fakesnapd/copyright /usr/bin/rollout-demo \
		/usr/share/man/man1/rollout-demo.1.gz /usr/share/man/man1/snapsvc-rollout-list.1.gz; do
		inside test -s "$f" || { say "the packages did not install $f"; return 1; }
	done
	# Each package's man pages are its own (dpkg -S names the owner).
	inside sh -c 'dpkg -S /usr/share/man/man1/snapsvc-rollout.1.gz | grep -q "^snapsvc-rollout: "' ||
		{ say "snapsvc-rollout.1.gz is not snapsvc-rollout's"; return 1; }
	inside sh -c 'dpkg -S /usr/bin/fakesnapd | grep -q "^snapsvc-fakesnapd: "' ||
		{ say "/usr/bin/fakesnapd is not snapsvc-fakesnapd's"; return 1; }
	say "installed: binaries, $(inside sh -c 'ls /usr/share/man/man1/snapsvc*.1.gz /usr/share/man/man1/fakesnapd*.1.gz | wc -l') man pages ($(inside sh -c 'ls /usr/share/man/man1/snapsvc-rollout*.1.gz | wc -l') of snapsvc-rollout), bash/zsh/fish completion"
	say "\$ snapsvc --version"
	inside /usr/bin/snapsvc --version || return 1
	# The version the package says is the one the binary says (0.2.0 and
	# v0.2.0; 0.2.0+3.gabc1234 and v0.2.0-3-gabc1234).
	local debv
	debv=$(inside dpkg-query -W -f='${Version}' snapsvc)
	local gotv
	gotv=$(inside /usr/bin/snapsvc --version)
	grep -q "^snapsvc v$(echo "$debv" | sed 's/~/-/; s/+\([0-9]*\)\.g/-\1-g/; s/[.+]dirty$/-dirty/') " <<<"$gotv" ||
		{ say "snapsvc --version does not say the package's version $debv"; return 1; }
	say "\$ snapsvc-rollout --version"
	inside /usr/bin/snapsvc-rollout --version || return 1
	# rollout-demo packaged: without an installed etcd it says what to
	# install (it cannot build etcd's server there).
	say "\$ rollout-demo --serve   (no etcd installed)"
	inside sh -c 'ROLLOUT_DEMO_ETCD= rollout-demo --serve 2>&1; echo "exit $?"' | tee "$work/demo.out"
	grep -q "needs etcd: install it (Debian: apt install etcd-server" "$work/demo.out" && grep -qx "exit 1" "$work/demo.out" ||
		{ say "the packaged rollout-demo without etcd does not say what to install"; return 1; }
	# The man page renders, and the completion script defines its function.
	inside sh -c 'zcat /usr/share/man/man1/snapsvc-rollout.1.gz | grep -q "^\.TH \"SNAPSVC-ROLLOUT\""' ||
		{ say "snapsvc-rollout.1.gz is not snapsvc-rollout's man page"; return 1; }
	inside grep -q __start_snapsvc-rollout /usr/share/bash-completion/completions/snapsvc-rollout ||
		{ say "the bash completion of snapsvc-rollout defines no __start_snapsvc-rollout"; return 1; }
	main_before=$(inside systemctl show -p MainPID --value snap.svcdemo.alpha.service)
	say "\$ snapsvc restart svcdemo.alpha   (MainPID $main_before)"
	inside /usr/bin/snapsvc restart svcdemo.alpha || return 1
	main_after=$(inside systemctl show -p MainPID --value snap.svcdemo.alpha.service)
	say "svcdemo.alpha's MainPID $main_before -> $main_after"
	[ "$main_after" != "$main_before" ] && [ "$main_after" != 0 ] || { say "the installed snapsvc did not restart svcdemo.alpha"; return 1; }
	say "\$ snapsvc tasks --last=service-control"
	inside /usr/bin/snapsvc tasks --last=service-control || return 1
	say "\$ snapsvc services svcdemo.alpha"
	inside /usr/bin/snapsvc services svcdemo.alpha || return 1
	# logs: the installed snapsvc prints what snap prints, byte for byte,
	# on this real snapd and its journal.
	local args
	for args in "svcdemo.alpha" "-n=3 svcdemo" "-n=all svcdemo.alpha" "--abs-time -n=2 svcdemo"; do
		say "\$ snapsvc logs $args   (and snap logs $args)"
		inside sh -c "snap logs $args >/tmp/logs.snap 2>&1; echo \$? >>/tmp/logs.snap; snapsvc logs $args >/tmp/logs.snapsvc 2>&1; echo \$? >>/tmp/logs.snapsvc; cmp /tmp/logs.snap /tmp/logs.snapsvc" ||
			{ inside sh -c 'diff /tmp/logs.snap /tmp/logs.snapsvc'; say "snapsvc logs $args differs from snap logs $args"; return 1; }
	done
	inside sh -c 'tail -3 /tmp/logs.snapsvc'
	# A user who is not root: refused at once, told to try sudo, as snap
	# tells it; nothing done.
	say "\$ setpriv --reuid=65534 ... snapsvc restart svcdemo.alpha   (as nobody)"
	main_before=$(inside systemctl show -p MainPID --value snap.svcdemo.alpha.service)
	inside sh -c 'setpriv --reuid=65534 --regid=65534 --clear-groups -- snapsvc --timeout 60s restart svcdemo.alpha >/tmp/nobody.out 2>&1; echo "exit $?" >>/tmp/nobody.out; cat /tmp/nobody.out'
	inside sh -c 'grep -q "(try with sudo)" /tmp/nobody.out && grep -qx "exit 1" /tmp/nobody.out' ||
		{ say "snapsvc as nobody: not a permission error (exit 1, try with sudo)"; return 1; }
	[ "$(inside systemctl show -p MainPID --value snap.svcdemo.alpha.service)" = "$main_before" ] ||
		{ say "snapsvc as nobody restarted svcdemo.alpha"; return 1; }
}
if check_packages; then
	say "release packages: installed and run against snapd $ver"
else
	say "release packages: FAILED in the container"
	[ "$rc" -ne 0 ] || rc=1
fi
collect_logs
if [ "${SNAPSVC_REALSNAPD_KEEP:-}" = 1 ] && [ -t 0 ]; then
	say "container kept up: nsenter -t $leader -a -- snap changes ; press Enter to tear down"
	read -r _
fi
[ "$rc" -eq 0 ] || die "realsnapd tests failed (exit $rc)"
say "PASS: real snapd $ver ($suite)"
