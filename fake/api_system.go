package fake

import (
	"encoding/json"
	"strings"
	"syscall"
)

// System information as the profile's snapd reports it (daemon/api_general.go
// sysInfo). Keys by release: "features" came with 2.62 (not in 2.57.6),
// "snapd-bin-from" after 2.70 (in 2.77). The feature and sandbox-feature
// lists are the ones captured from 2.68.3 (used for 2.62 and 2.68) and
// 2.77.1 (used for 2.70 and 2.77) in a Debian container
// (testdata/snapd-golden/*/system-info.json); "virtualization" is left out
// as snapd does when systemd-detect-virt finds none, and there is no
// refresh hold.

// features268 and sandbox268 are captured from snapd 2.68.3.
const features268 = `{"apparmor-prompting":{"supported":false,"unsupported-reason":"cannot check apparmor kernel features: open /sys/kernel/security/apparmor/features: no such file or directory","enabled":false},"check-disk-space-install":{"supported":true,"enabled":false},"check-disk-space-refresh":{"supported":true,"enabled":false},"check-disk-space-remove":{"supported":true,"enabled":false},"classic-preserves-xdg-runtime-dir":{"supported":true,"enabled":true},"confdb-control":{"supported":true,"enabled":false},"confdbs":{"supported":true,"enabled":false},"dbus-activation":{"supported":true,"enabled":true},"gate-auto-refresh-hook":{"supported":true,"enabled":false},"gpio-chardev-interface":{"supported":true,"enabled":false},"hidden-snap-folder":{"supported":true,"enabled":false},"hotplug":{"supported":true,"enabled":false},"layouts":{"supported":true,"enabled":true},"move-snap-home-dir":{"supported":true,"enabled":false},"parallel-instances":{"supported":true,"enabled":false},"per-user-mount-namespace":{"supported":true,"enabled":false},"quota-groups":{"supported":true,"enabled":false},"refresh-app-awareness":{"supported":true,"enabled":true},"refresh-app-awareness-ux":{"supported":true,"enabled":false},"user-daemons":{"supported":true,"enabled":false}}`
const sandbox268 = `{"configfiles":["mediated-configfiles"],"confinement-options":["classic","devmode"],"dbus":["mediated-bus-access"],"kmod":["mediated-modprobe"],"ldconfig":["mediated-ldconfig"],"mount":["freezer-cgroup-v1","layouts","mount-namespace","per-snap-persistency","per-snap-profiles","per-snap-updates","per-snap-user-profiles","stale-base-invalidation"],"seccomp":["bpf-actlog","bpf-argument-filtering","kernel:allow","kernel:errno","kernel:kill_process","kernel:kill_thread","kernel:log","kernel:trace","kernel:trap","kernel:user_notif"]}`

// features277 and sandbox277 are captured from snapd 2.77.1.
const features277 = `{"apparmor-prompting":{"supported":false,"unsupported-reason":"cannot check apparmor kernel features: open /sys/kernel/security/apparmor/features: no such file or directory","enabled":false},"check-disk-space-install":{"supported":true,"enabled":false},"check-disk-space-refresh":{"supported":true,"enabled":false},"check-disk-space-remove":{"supported":true,"enabled":false},"clustering":{"supported":true,"enabled":false},"confdb":{"supported":true,"enabled":false},"confdb-control":{"supported":true,"enabled":false},"content-compatibility-label":{"supported":true,"enabled":false},"gate-auto-refresh-hook":{"supported":true,"enabled":false},"hidden-snap-folder":{"supported":true,"enabled":false},"hotplug":{"supported":true,"enabled":false},"move-snap-home-dir":{"supported":true,"enabled":false},"parallel-instances":{"supported":true,"enabled":false},"quota-groups":{"supported":true,"enabled":true},"refresh-app-awareness-ux":{"supported":true,"enabled":false},"remote-device-management":{"supported":true,"enabled":false},"seed-refresh":{"supported":true,"enabled":false},"snap-delta-format":{"supported":true,"enabled":false},"user-daemons":{"supported":true,"enabled":false}}`
const sandbox277 = `{"configfiles":["mediated-configfiles"],"confinement-options":["classic","devmode"],"dbus":["mediated-bus-access"],"kmod":["mediated-modprobe"],"ldconfig":["mediated-ldconfig"],"mount":["freezer-cgroup-v1","layouts","mount-namespace","per-snap-persistency","per-snap-profiles","per-snap-updates","per-snap-user-profiles","stale-base-invalidation"],"seccomp":["bpf-actlog","bpf-argument-filtering","kernel:allow","kernel:errno","kernel:kill_process","kernel:kill_thread","kernel:log","kernel:trace","kernel:trap","kernel:user_notif"],"symlinks":["mediated-symlinks"],"udev":["device-cgroup-v1","device-filtering","tagging"]}`

// debianVersions are the version strings Debian's builds report (the
// package version: 2.57.6 from Debian 12's snapd_2.57.6-1+deb12u1+b2,
// 2.68.3 and 2.77.1 as captured); other profiles report themselves.
var debianVersions = map[Version]string{
	Version257: "2.57.6-1+deb12u1+b2",
	Version268: "2.68.3-3+deb13u1+b7",
	Version277: "2.77.1-2",
}

// reportedVersion is the "version" of GET /v2/system-info.
func (v Version) reportedVersion() string {
	if d, ok := debianVersions[v]; ok {
		return d
	}
	return string(v)
}

func kernelVersion() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return "6.1.0"
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

func (s *Server) sysInfo() *response {
	v := s.cfg.version
	osVersion := "13"
	if !v.atLeast(Version262) {
		osVersion = "12"
	}
	m := map[string]any{
		"series":         "16",
		"version":        v.reportedVersion(),
		"build-id":       "fakesnapd" + strings.ReplaceAll(string(v), ".", ""),
		"os-release":     map[string]string{"id": "debian", "version-id": osVersion},
		"on-classic":     true,
		"managed":        false,
		"kernel-version": kernelVersion(),
		"locations":      map[string]string{"snap-mount-dir": "/snap", "snap-bin-dir": "/snap/bin"},
		"refresh":        map[string]string{"timer": "00:00~24:00/4"},
		"architecture":   "amd64",
		"system-mode":    "run",
		"confinement":    "partial",
	}
	features, sandbox := features268, sandbox268
	if v.atLeast(Version270) {
		features, sandbox = features277, sandbox277
	}
	m["sandbox-features"] = json.RawMessage(sandbox)
	if v.atLeast(Version262) {
		m["features"] = json.RawMessage(features)
	}
	if v.atLeast("2.77") {
		m["snapd-bin-from"] = "native-package"
	}
	return syncResp(m)
}
