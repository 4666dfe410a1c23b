package snapsvc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// FuzzValidateName: names are accepted exactly when they are "snap" or
// "snap.app" by snapd's rules, and what is accepted splits back into the
// name: no path tricks, no empty parts, no second dot.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"k8s", "k8s.kubelet", "k8s_x1.kube-apiserver", "../etc", "k8s.", ".k8s", "a", "k8s.kube..x", "K8S", "k8s.a.b", "x-y-z.Svc-1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		snap, app, err := ValidateName(name)
		if err != nil {
			if !strings.Contains(err.Error(), "invalid service name") {
				t.Fatalf("%q: error without the reason's kind: %v", name, err)
			}
			return
		}
		want := snap
		if app != "" {
			want += "." + app
		}
		if want != name || snap == "" || strings.ContainsAny(name, "/ \t\n") || strings.Count(name, ".") > 1 || strings.Contains(name, "..") {
			t.Fatalf("%q accepted as snap %q app %q", name, snap, app)
		}
		if _, _, err := ValidateName(snap); err != nil {
			t.Fatalf("%q accepted, its snap %q not: %v", name, snap, err)
		}
	})
}

// FuzzChangeMatching: a lost answer is matched only to a service-control
// change spawned no earlier than the request, whose tasks do what the
// request asks, on every snap it names — whatever snapd's listing holds.
func FuzzChangeMatching(f *testing.F) {
	files, _ := filepath.Glob("../testdata/snapd-golden/*/*.json")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		if strings.Contains(string(b), `"service-control"`) {
			f.Add(b, "restart", "svcdemo.alpha", false, false, false)
			f.Add(b, "start", "svcdemo", true, false, false)
			f.Add(b, "stop", "svcdemo.beta,svcdemo.gamma", false, true, false)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, action, names string, enable, disable, reload bool) {
		var env struct {
			Result json.RawMessage `json:"result"`
		}
		if json.Unmarshal(body, &env) != nil {
			return
		}
		var chgs []snapd.Change
		if json.Unmarshal(env.Result, &chgs) != nil {
			var one snapd.Change
			if json.Unmarshal(env.Result, &one) != nil {
				return
			}
			chgs = []snapd.Change{one}
		}
		t0, err := parseTarget(strings.Split(names, ","))
		if err != nil {
			return
		}
		o := request{action: action, enable: enable, disable: disable, reload: reload, t: t0}
		sentAt := time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC)
		for i := range chgs {
			if i%2 == 0 {
				chgs[i].SpawnTime = sentAt.Add(-time.Nanosecond)
			}
		}
		// svcdemo's services, as a whole-snap start or stop lists them.
		all := map[string][]string{"svcdemo": {"alpha", "beta", "gamma"}}
		for _, id := range opCandidates(chgs, o, all, 0, sentAt, sentAt, time.Time{}, nil) {
			i := slices.IndexFunc(chgs, func(c snapd.Change) bool { return c.ID == id })
			chg := chgs[i]
			if chg.Kind != "service-control" || chg.SpawnTime.Before(sentAt) {
				t.Fatalf("candidate %s: kind %s spawned %v, request sent %v", id, chg.Kind, chg.SpawnTime, sentAt)
			}
			word := action
			if reload {
				word = "reload-or-restart"
			}
			for _, snap := range o.t.snaps {
				ok := slices.ContainsFunc(chg.Tasks, func(tk snapd.Task) bool {
					return tk.Kind == "service-control" && strings.Contains(tk.Summary, `command "`+word+`"`) && strings.HasSuffix(tk.Summary, ` of snap "`+snap+`"`)
				})
				if !ok {
					t.Fatalf("candidate %s does not %s snap %s: %+v", id, word, snap, chg.Tasks)
				}
				if action != "restart" && namesWholeOnly(o, snap) {
					list := fmt.Sprintf(" for services %q of snap %q", all[snap], snap)
					if !slices.ContainsFunc(chg.Tasks, func(tk snapd.Task) bool { return strings.HasSuffix(tk.Summary, list) }) {
						t.Fatalf("candidate %s for a %s of the whole snap %s does not list all its services: %+v", id, action, snap, chg.Tasks)
					}
				}
			}
		}
	})
}
