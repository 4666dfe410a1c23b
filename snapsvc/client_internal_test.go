package snapsvc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestModeAndHookDetection(t *testing.T) {
	cases := []struct {
		name     string
		env      map[string]string
		args0    string
		opts     []Option
		mode     Mode
		hook     string
		lockDir  string
		ownSnap  string
		queueing bool
	}{
		{name: "outside a snap", env: nil, mode: ModeREST, lockDir: defaultLockDirs("/run/snapd.socket", envOf(nil)).of("k8s")},
		{name: "daemon in a snap", env: map[string]string{"SNAP_COOKIE": "c", "SNAP_NAME": "k8s", "SNAP_INSTANCE_NAME": "k8s", "SNAP_COMMON": "/var/snap/k8s/common"},
			mode: ModeSnapctl, ownSnap: "k8s", lockDir: "/var/snap/k8s/common/.snapsvc-lock"},
		{name: "configure hook by argv", env: map[string]string{"SNAP_COOKIE": "h", "SNAP_CONTEXT": "h", "SNAP_NAME": "k8s"},
			args0: "/snap/k8s/x1/meta/hooks/configure", mode: ModeSnapctl, hook: "configure", ownSnap: "k8s", queueing: true},
		{name: "install hook by env", env: map[string]string{"SNAP_CONTEXT": "h", "SNAP_NAME": "k8s", "SNAPSVC_HOOK": "install"},
			mode: ModeSnapctl, hook: "install", ownSnap: "k8s"},
		{name: "forced REST inside a snap", env: map[string]string{"SNAP_COOKIE": "c", "SNAP_NAME": "k8s"}, opts: []Option{WithMode(ModeREST)}, mode: ModeREST},
		{name: "explicit hook", env: map[string]string{"SNAP_COOKIE": "c"}, opts: []Option{WithHook("default-configure")}, mode: ModeSnapctl, hook: "default-configure", queueing: true},
		{name: "fake socket", opts: []Option{WithSocket("/tmp/x/snapd.socket")}, mode: ModeREST, lockDir: "/tmp/x/.snapsvc-lock"},
		{name: "no file lock", opts: []Option{WithoutFileLock()}, mode: ModeREST, lockDir: ""},
		{name: "explicit lock dir", opts: []Option{WithLockDir("/srv/locks")}, mode: ModeREST, lockDir: "/srv/locks"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.args0 != "" {
				old := os.Args[0]
				os.Args[0] = tc.args0
				defer func() { os.Args[0] = old }()
			}
			c, err := New(append([]Option{withEnv(envOf(tc.env))}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			if c.Mode() != tc.mode || c.Hook() != tc.hook || c.queuesInHook() != tc.queueing {
				t.Errorf("mode %v hook %q queueing %v", c.Mode(), c.Hook(), c.queuesInHook())
			}
			if tc.lockDir != "" || tc.name == "no file lock" {
				if got := c.lockDirs.of("k8s"); got != tc.lockDir {
					t.Errorf("lock dir %q, want %q", got, tc.lockDir)
				}
			}
			if tc.ownSnap != "" && c.ownSnap != tc.ownSnap {
				t.Errorf("own snap %q", c.ownSnap)
			}
		})
	}
	if _, err := New(withEnv(envOf(nil)), WithMode(ModeSnapctl)); err == nil {
		t.Error("snapctl mode without a cookie was accepted")
	}
}

func TestHookFromArgs(t *testing.T) {
	for args, want := range map[string]string{
		"/snap/k8s/1234/meta/hooks/configure":          "configure",
		"/bin/sh /snap/k8s/x1/meta/hooks/post-refresh": "post-refresh",
		"/snap/k8s/x1/snap/hooks/install":              "install",
		"/snap/k8s/x1/bin/k8sd":                        "",
		"/usr/bin/hooks/configure":                     "",
	} {
		if got := hookFromArgs(strings.Fields(args)); got != want {
			t.Errorf("%q: %q, want %q", args, got, want)
		}
	}
	// This test's own parent is not a hook.
	if pp := procParent(os.Getpid()); pp != os.Getppid() {
		t.Errorf("procParent = %d, want %d", pp, os.Getppid())
	}
	if args := procCmdline(os.Getpid()); len(args) == 0 || args[0] != os.Args[0] {
		t.Errorf("procCmdline = %q", args)
	}
}

func TestParseServicesTable(t *testing.T) {
	// As snapd 2.57.6 printed it (testdata/snapd-golden/2.57.6/snapctl-services.json).
	table := "Service            Startup   Current  Notes\nsvcdemo.alpha      enabled   active   -\nsvcdemo.slowstart  disabled  inactive   -\n"
	svcs, err := parseServicesTable(table)
	if err != nil || len(svcs) != 2 {
		t.Fatalf("%+v %v", svcs, err)
	}
	if svcs[0] != (Service{Snap: "svcdemo", Name: "alpha", Enabled: true, Active: true}) || svcs[1] != (Service{Snap: "svcdemo", Name: "slowstart"}) {
		t.Errorf("%+v", svcs)
	}
	if _, err := parseServicesTable("Service Startup Current Notes\ngarbage\n"); err == nil {
		t.Error("garbage accepted")
	}
}

func TestDefaultLockDirIsNotWorldWritable(t *testing.T) {
	snapDataDir = t.TempDir() // no snap is installed
	defer func() { snapDataDir = "/var/snap" }()
	dir := defaultLockDirs("/run/snapd.socket", envOf(nil)).of("k8s")
	if os.Geteuid() == 0 && dir != "/run/snapsvc" {
		t.Errorf("root's lock dir %s, want /run/snapsvc (not under world-writable /run/lock)", dir)
	}
	if strings.HasPrefix(dir, "/run/lock") {
		t.Errorf("lock dir %s under /run/lock, where any user can create it first", dir)
	}
}

// An operator's CLI on the host and the snap's own processes find the
// same lock directory for the snap, when both run as root: the snap's
// $SNAP_COMMON/.snapsvc-lock (the CLI used /run/snapsvc, and shared
// nothing with k8sd's controllers). A snap that is not installed has
// root's /run/snapsvc; another user, a directory of its own.
func TestLockDirOfASnapIsSharedByTheHostAndTheSnap(t *testing.T) {
	data := t.TempDir()
	snapDataDir = data
	defer func() { snapDataDir = "/var/snap" }()
	common := filepath.Join(data, "k8s", "common")
	if err := os.MkdirAll(common, 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(common, ".snapsvc-lock")
	asRoot := func(f func()) {
		lockDirEuid = func() int { return 0 }
		defer func() { lockDirEuid = os.Geteuid }()
		f()
	}
	asRoot(func() {
		host := defaultLockDirs("/run/snapd.socket", envOf(nil))
		daemon := defaultLockDirs("/run/snapd.socket", envOf(map[string]string{"SNAP_INSTANCE_NAME": "k8s", "SNAP_NAME": "k8s", "SNAP_COMMON": common}))
		hook := defaultLockDirs("/run/snapd-snap.socket", envOf(map[string]string{"SNAP_NAME": "k8s", "SNAP_COMMON": common}))
		for name, d := range map[string]*lockDirs{"the host's CLI": host, "k8sd": daemon, "a hook": hook} {
			if got := d.of("k8s"); got != want {
				t.Errorf("%s: lock directory of k8s %s, want %s", name, got, want)
			}
		}
		if got := host.of("absent"); got != "/run/snapsvc" {
			t.Errorf("the host's CLI: lock directory of a snap not installed %s, want /run/snapsvc", got)
		}
	})
	lockDirEuid = func() int { return 1000 }
	defer func() { lockDirEuid = os.Geteuid }()
	if got := defaultLockDirs("/run/snapd.socket", envOf(nil)).of("k8s"); got != filepath.Join(os.TempDir(), "snapsvc-1000") {
		t.Errorf("another user's lock directory of k8s: %s", got)
	}
}
