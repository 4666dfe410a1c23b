package snapd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAbsent(t *testing.T) {
	for _, c := range []struct {
		name   string
		files  []string
		absent bool
		why    string
	}{
		{"empty", nil, true, "neither"},
		{"deb daemon, systemd", []string{"usr/lib/snapd/snapd", "run/systemd/system/"}, false, ""},
		{"libexec daemon, systemd", []string{"usr/libexec/snapd/snapd", "run/systemd/system/"}, false, ""},
		{"core: unit in /etc", []string{"etc/systemd/system/snapd.socket", "run/systemd/system/"}, false, ""},
		{"unit in /usr/lib", []string{"usr/lib/systemd/system/snapd.socket", "run/systemd/system/"}, false, ""},
		{"installed, no systemd", []string{"usr/lib/snapd/snapd", "lib/systemd/system/snapd.socket"}, true, "systemd is not running"},
		{"state only (removed, not purged)", []string{"var/lib/snapd/state.json", "run/systemd/system/"}, true, "neither"},
	} {
		dir := t.TempDir()
		for _, f := range c.files {
			p := filepath.Join(dir, f)
			if strings.HasSuffix(f, "/") {
				if err := os.MkdirAll(p, 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		absent, why := Absent(dir)
		if absent != c.absent || !strings.Contains(why, c.why) {
			t.Errorf("%s: absent %t (%q), want %t (%q)", c.name, absent, why, c.absent, c.why)
		}
	}
}
