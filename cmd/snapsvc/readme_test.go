package main

import (
	"context"
	"errors"
	"go/format"
	"go/parser"
	"go/token"
	"io"
	"log"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/plan"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// The functions below mirror the Go snippets of README.md, in order, each
// between a "readme:begin" and a "readme:end" comment; TestReadmeSnippets
// checks that they are the README's text (after gofmt), so every snippet
// compiles. The controller and the fake test also run.

// The snippets are compiled, not all called.
var _ = []any{readmeHook, readmeSnapservices, readmePlan}

func readmeHook(ctx context.Context) error {
	// readme:begin
	c, err := snapsvc.New() // inside a snap: snapctl with $SNAP_COOKIE; outside: /run/snapd.socket
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Start(ctx, []string{"k8s.containerd", "k8s.kube-apiserver", "k8s.kubelet"},
		snapsvc.StartOptions{Enable: true})
	if err != nil {
		return err // *snapsvc.OpError: what, which services, which change, retryable or not
	}
	if res.Queued {
		// In a configure/default-configure hook snapd runs service commands only after the hook
		// ends; waiting for them here would deadlock, so snapsvc returns at once.
	}
	// readme:end
	return nil
}

func readmeController(ctx context.Context, c *snapsvc.Client) error {
	// readme:begin
	res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Retryable():
		// snapd stayed busy (or unreachable) past the retry policy: requeue and try later.
	case err != nil:
		return err // unknown service, a change that ended in Error, ... retrying won't help
	}
	log.Printf("kubelet restarted by change %s after absorbing %d conflicts", res.ChangeID, res.Conflicts)
	// readme:end
	return nil
}

func readmeSnapservices(ctx context.Context) error {
	// readme:begin
	svc := snapservices.Open(snapservices.WithDefaultInstance("k8s")) // $SNAP_INSTANCE_NAME, else "k8s"; REST on /run/snapd.socket
	defer svc.Close()
	// k8sd's bootstrap with RetryFor replaced: a failed start is tried again, bad input and unknown outcomes are not.
	err := retry.Do(ctx, 5, 5*time.Second, func() error {
		if err := svc.StartServices(ctx, []string{"etcd"}); err != nil { // start implies --enable, as in k8sd
			return err
		}
		return svc.StartServices(ctx, []string{"containerd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"})
	})
	// readme:end
	return err
}

func readmePlan(ctx context.Context, client *snapsvc.Client, ca string) error {
	// readme:begin
	p, err := plan.New([]plan.Service{
		{Name: "k8s.containerd"},
		{Name: "k8s.etcd", Probe: probe.TCP{Address: "127.0.0.1:2379"}},
		{Name: "k8s.kube-apiserver", After: []string{"k8s.etcd"}, Probe: &probe.HTTP{URL: "https://127.0.0.1:6443/readyz", CAFile: ca}},
		{Name: "k8s.kubelet", After: []string{"k8s.containerd", "k8s.kube-apiserver"}},
		{Name: "k8s.kube-scheduler", After: []string{"k8s.kube-apiserver"}},
	}, plan.Options{Enable: true})
	if err != nil {
		return err // a cycle, an unknown name in After
	}
	go p.Start(ctx, client) // three changes: {containerd, etcd}, {kube-apiserver}, {kubelet, kube-scheduler}
	err = p.WaitReady(ctx)  // controllers gate on this (or select on p.Ready())
	// readme:end
	return err
}

// readme:begin
func TestRestartWaitsForSnapSet(t *testing.T) {
	// AllowNonRoot: your hook runs as root, go test as you; snapd lets only root restart.
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", StartDuration: 5 * time.Millisecond},
	}}))
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	busy := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"}) // someone runs `snap set`
	// Its configure hook ends once snapd has refused the restart.
	go func() {
		srv.WaitFor(t.Context(), func(v fake.View) bool { return v.Handled("POST /v2/apps") > 0 })
		busy.Finish()
	}()
	// Your hook or controller here: this restart waits for the snap set, then restarts kubelet.
	if _, err := c.Restart(t.Context(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	// Also srv.Counters(), srv.Requests().
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Error("kubelet not active")
	}
}

// readme:end

// snippet is one Go snippet: the packages it imports and its code.
type snippet struct {
	imports []string
	// code is the snippet's code gofmt'd, raw as the README has it.
	code, raw string
}

var (
	reGoBlock   = regexp.MustCompile("(?s)```go\n(.*?)```\n")
	reImportOne = regexp.MustCompile(`^import\s+("[^"]+")\s*$`)
	reImportsIn = regexp.MustCompile(`(?s)^import\s*\((.*?)\)\s*`)
)

// parseSnippet splits a README snippet into its imports and its code, the
// code gofmt'd: as a file's declarations when it declares a func, else as
// a function body (dedented).
func parseSnippet(t *testing.T, text string) snippet {
	t.Helper()
	var s snippet
	text = strings.TrimLeft(text, "\n")
	if m := reImportsIn.FindStringSubmatch(text); m != nil {
		for _, l := range strings.Split(m[1], "\n") {
			if l = strings.TrimSpace(l); l != "" {
				s.imports = append(s.imports, l)
			}
		}
		text = text[len(m[0]):]
	} else if first, rest, _ := strings.Cut(text, "\n"); reImportOne.MatchString(first) {
		s.imports = append(s.imports, reImportOne.FindStringSubmatch(first)[1])
		text = rest
	}
	text = strings.TrimLeft(text, "\n")
	s.raw = strings.TrimSpace(text)
	decl := strings.HasPrefix(text, "func ")
	src := "package p\n\n" + text
	if !decl {
		src = "package p\n\nfunc _() {\n" + text + "}\n"
	}
	out, err := format.Source([]byte(src))
	if err != nil {
		t.Fatalf("README snippet does not parse: %v\n%s", err, text)
	}
	code := strings.TrimPrefix(string(out), "package p\n\n")
	if !decl {
		code = strings.TrimSuffix(strings.TrimPrefix(code, "func _() {\n"), "}\n")
		code = dedent(code)
	}
	s.code = strings.TrimSpace(code)
	return s
}

// dedent removes one leading tab from every line.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, "\t")
	}
	return strings.Join(lines, "\n")
}

// mirrors returns the regions of this file between the markers, dedented
// to the markers' indentation.
func mirrors(t *testing.T, src string) []string {
	t.Helper()
	var out []string
	lines := strings.Split(src, "\n")
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "// readme:begin" {
			continue
		}
		indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], "\t"))]
		var region []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "// readme:end"; i++ {
			region = append(region, strings.TrimPrefix(lines[i], indent))
		}
		out = append(out, strings.TrimSpace(strings.Join(region, "\n")))
	}
	return out
}

// TestReadmeSnippets checks that every Go snippet of README.md is mirrored,
// word for word, by the functions above (which the compiler checks), that
// the packages it imports are the module's, and runs the controller's
// snippet against the fake.
func TestReadmeSnippets(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("readme_test.go")
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "readme_test.go", self, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	imported := map[string]bool{}
	for _, imp := range f.Imports {
		imported[imp.Path.Value] = true
	}
	// The snippets in the order the functions above mirror them: the
	// README's hook and controller, the snapservices and plan pages' (moved
	// out of the README), the README's test against the fake.
	blocks := reGoBlock.FindAllStringSubmatch(string(readme), -1)
	if len(blocks) != 3 {
		t.Fatalf("README.md has %d Go snippets, want 3 (hook, controller, test against the fake)", len(blocks))
	}
	var moved [][]string
	for _, page := range []string{"../../docs/snapservices.md", "../../docs/plan.md"} {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		moved = append(moved, reGoBlock.FindAllStringSubmatch(string(b), -1)...)
	}
	blocks = append(append(blocks[:2:2], moved...), blocks[2:]...)
	got := mirrors(t, string(self))
	if len(blocks) != len(got) {
		t.Fatalf("README.md and its pages have %d Go snippets, readme_test.go mirrors %d", len(blocks), len(got))
	}
	sawImport := false
	for i, b := range blocks {
		s := parseSnippet(t, b[1])
		if s.raw != s.code {
			t.Errorf("README snippet %d is not gofmt-clean:\n--- README\n%s\n--- gofmt\n%s", i+1, s.raw, s.code)
		}
		if s.code != got[i] {
			t.Errorf("README snippet %d differs from its mirror in readme_test.go:\n--- README (gofmt'd)\n%s\n--- mirror\n%s", i+1, s.code, got[i])
		}
		for _, imp := range s.imports {
			sawImport = true
			path, _ := strconv.Unquote(imp)
			if !imported[imp] || !strings.HasPrefix(path, "github.com/snapsvc/snapsvc/") {
				t.Errorf("README snippet %d imports %s, which the mirror does not, or which is not the module's", i+1, imp)
			}
		}
		if strings.Contains(s.code, "snapsvc.New(") && !strings.Contains(s.code, "defer c.Close()") {
			t.Errorf("README snippet %d builds a client but does not close it:\n%s", i+1, s.code)
		}
	}
	if !sawImport || !strings.Contains(string(readme), `import "github.com/snapsvc/snapsvc/snapsvc"`) {
		t.Error("README snippets do not show the import path github.com/snapsvc/snapsvc/snapsvc")
	}

	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	log.SetOutput(io.Discard) // the snippet's log line
	defer log.SetOutput(os.Stderr)
	if err := readmeController(t.Context(), c); err != nil {
		t.Errorf("the controller snippet against the fake: %v", err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Error("the controller snippet did not restart kubelet")
	}
}
