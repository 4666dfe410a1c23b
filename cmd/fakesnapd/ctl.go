package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

const ctlUsage = `usage: fakesnapd ctl (--dir D | --root R) COMMAND [ARGS]

commands (answers are JSON unless said otherwise):
  state                              version, sockets, snaps (with cookies), services, changes in progress
  services [SNAP]                    services and their state
  changes                            every change
  hold KIND SNAP [SUMMARY]           add a foreign change (e.g. configure-snap, auto-refresh) that holds SNAP; prints its id
  finish ID | next ID | abort ID     finish a held change, finish only its current task, abort it
  fail ID [MESSAGE]                  fail a held change's current task
  maintenance on [KIND [MESSAGE]]    add "maintenance" to every answer (default daemon-restart)
  maintenance off
  restart [DOWN]                     snapd restart: maintenance, sockets gone for DOWN (default 1s), back
  cookie SNAP                        print SNAP's SNAP_COOKIE (for snapctl)
  fail-start SNAP.APP [MESSAGE]      make starting the service fail (systemctl's usual text by default)
  clear-fail-start SNAP.APP          starts succeed again
  durations SNAP.APP START STOP      how long starting and stopping take (Go durations)
  service SNAP.APP enabled|disabled active|inactive
  store SNAP REVISION [VERSION [CHANNEL]]   what a refresh of SNAP finds in the store
  held SNAP                          the hold of SNAP's refreshes (snap refresh --hold): until, level
  warn MESSAGE                       add a snapd warning
  log SNAP.APP MESSAGE               add a line to the service's journal (snap logs)
  latency DURATION                   delay every answer
  requests | counters                the request log, the counters
  wait [conflicts=N] [requests=N] [idle] [timeout=D]   block until reached
`

func runCtl(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fakesnapd ctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stdout, ctlUsage) } // help on stdout, as every command's
	dir := fs.String("dir", "", "the directory fakesnapd serves its sockets in")
	root := fs.String("root", "", "the --root fakesnapd was given")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	d, err := socketDir(*dir, *root)
	if err != nil {
		fmt.Fprintf(stderr, "fakesnapd ctl: %v\n%s", err, ctlUsage)
		return 2
	}
	req, raw, err := ctlRequest(fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "fakesnapd ctl: %v\n%s", err, ctlUsage)
		return 2
	}
	sock := filepath.Join(d, "control.socket")
	status, body, err := ctlDo(sock, req)
	if err != nil {
		fmt.Fprintf(stderr, "fakesnapd ctl: cannot reach fakesnapd at %s: %v\n", sock, err)
		return 3
	}
	if status >= 300 {
		var e struct{ Error string }
		json.Unmarshal(body, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(body))
		}
		fmt.Fprintf(stderr, "fakesnapd ctl: %s\n", e.Error)
		return 1
	}
	if raw != "" {
		var m map[string]any
		json.Unmarshal(body, &m)
		fmt.Fprintln(stdout, m[raw])
		return 0
	}
	var out bytes.Buffer
	if json.Indent(&out, body, "", "  ") != nil {
		out.Reset()
		out.Write(body)
	}
	fmt.Fprint(stdout, strings.TrimRight(out.String(), "\n")+"\n")
	return 0
}

type ctlReq struct {
	method, path string
	body         map[string]any
}

func splitService(s string) (string, string, error) {
	snap, app, ok := strings.Cut(s, ".")
	if !ok || snap == "" || app == "" {
		return "", "", fmt.Errorf("%q: want SNAP.APP", s)
	}
	return snap, app, nil
}

// ctlRequest maps a command line to a control API request; raw names the
// answer's field to print alone (hold: id, cookie: cookie).
func ctlRequest(args []string) (ctlReq, string, error) {
	if len(args) == 0 {
		return ctlReq{}, "", errors.New("no command")
	}
	cmd, rest := args[0], args[1:]
	need := func(min, max int) error {
		if len(rest) < min || (max >= 0 && len(rest) > max) {
			return fmt.Errorf("%s: wrong number of arguments", cmd)
		}
		return nil
	}
	get := func(p string) ctlReq { return ctlReq{method: "GET", path: p} }
	post := func(p string, b map[string]any) ctlReq { return ctlReq{method: "POST", path: p, body: b} }
	switch cmd {
	case "state", "changes", "requests", "counters":
		if err := need(0, 0); err != nil {
			return ctlReq{}, "", err
		}
		return get("/" + cmd), "", nil
	case "services":
		if err := need(0, 1); err != nil {
			return ctlReq{}, "", err
		}
		p := "/services"
		if len(rest) == 1 {
			p += "?snap=" + url.QueryEscape(rest[0])
		}
		return get(p), "", nil
	case "hold":
		if err := need(2, 3); err != nil {
			return ctlReq{}, "", err
		}
		b := map[string]any{"kind": rest[0], "snap": rest[1]}
		if len(rest) == 3 {
			b["summary"] = rest[2]
		}
		return post("/changes", b), "id", nil
	case "finish", "next", "abort":
		if err := need(1, 1); err != nil {
			return ctlReq{}, "", err
		}
		return post("/changes/"+url.PathEscape(rest[0])+"/"+cmd, nil), "", nil
	case "fail":
		if err := need(1, 2); err != nil {
			return ctlReq{}, "", err
		}
		b := map[string]any{}
		if len(rest) == 2 {
			b["message"] = rest[1]
		}
		return post("/changes/"+url.PathEscape(rest[0])+"/fail", b), "", nil
	case "maintenance":
		if len(rest) >= 1 && rest[0] == "off" && len(rest) == 1 {
			return ctlReq{method: "DELETE", path: "/maintenance"}, "", nil
		}
		if len(rest) < 1 || rest[0] != "on" || len(rest) > 3 {
			return ctlReq{}, "", errors.New("maintenance on [KIND [MESSAGE]] | maintenance off")
		}
		b := map[string]any{}
		if len(rest) > 1 {
			b["kind"] = rest[1]
		}
		if len(rest) > 2 {
			b["message"] = rest[2]
		}
		return post("/maintenance", b), "", nil
	case "restart":
		if err := need(0, 1); err != nil {
			return ctlReq{}, "", err
		}
		b := map[string]any{}
		if len(rest) == 1 {
			b["down"] = rest[0]
		}
		return post("/restart", b), "", nil
	case "cookie":
		if err := need(1, 1); err != nil {
			return ctlReq{}, "", err
		}
		return get("/cookie?snap=" + url.QueryEscape(rest[0])), "cookie", nil
	case "fail-start", "clear-fail-start":
		max := 2
		if cmd == "clear-fail-start" {
			max = 1
		}
		if err := need(1, max); err != nil {
			return ctlReq{}, "", err
		}
		snap, app, err := splitService(rest[0])
		if err != nil {
			return ctlReq{}, "", err
		}
		b := map[string]any{"snap": snap, "app": app}
		switch {
		case cmd == "clear-fail-start":
			b["message"] = ""
		case len(rest) == 2:
			b["message"] = rest[1]
		}
		return post("/fail-start", b), "", nil
	case "durations":
		if err := need(3, 3); err != nil {
			return ctlReq{}, "", err
		}
		snap, app, err := splitService(rest[0])
		if err != nil {
			return ctlReq{}, "", err
		}
		return post("/durations", map[string]any{"snap": snap, "app": app, "start": rest[1], "stop": rest[2]}), "", nil
	case "service":
		if err := need(3, 3); err != nil {
			return ctlReq{}, "", err
		}
		snap, app, err := splitService(rest[0])
		if err != nil {
			return ctlReq{}, "", err
		}
		en, ac := rest[1], rest[2]
		if (en != "enabled" && en != "disabled") || (ac != "active" && ac != "inactive") {
			return ctlReq{}, "", errors.New("service SNAP.APP enabled|disabled active|inactive")
		}
		return post("/service", map[string]any{"snap": snap, "app": app, "enabled": en == "enabled", "active": ac == "active"}), "", nil
	case "store":
		if err := need(2, 4); err != nil {
			return ctlReq{}, "", err
		}
		b := map[string]any{"snap": rest[0], "revision": rest[1]}
		if len(rest) > 2 {
			b["version"] = rest[2]
		}
		if len(rest) > 3 {
			b["channel"] = rest[3]
		}
		return post("/store", b), "", nil
	case "held":
		if err := need(1, 1); err != nil {
			return ctlReq{}, "", err
		}
		return get("/hold?snap=" + url.QueryEscape(rest[0])), "", nil
	case "warn":
		if err := need(1, 1); err != nil {
			return ctlReq{}, "", err
		}
		return post("/warnings", map[string]any{"message": rest[0]}), "", nil
	case "log":
		if err := need(2, 2); err != nil {
			return ctlReq{}, "", err
		}
		snap, app, err := splitService(rest[0])
		if err != nil {
			return ctlReq{}, "", err
		}
		return post("/logs", map[string]any{"snap": snap, "app": app, "message": rest[1]}), "", nil
	case "latency":
		if err := need(1, 1); err != nil {
			return ctlReq{}, "", err
		}
		return post("/latency", map[string]any{"latency": rest[0]}), "", nil
	case "wait":
		q := url.Values{}
		for _, a := range rest {
			k, v, ok := strings.Cut(a, "=")
			switch {
			case a == "idle":
				q.Set("idle", "true")
			case ok && (k == "conflicts" || k == "requests" || k == "timeout"):
				q.Set(k, v)
			default:
				return ctlReq{}, "", fmt.Errorf("wait: unknown condition %q", a)
			}
		}
		return get("/wait?" + q.Encode()), "", nil
	}
	return ctlReq{}, "", fmt.Errorf("unknown command %q", cmd)
}

func ctlDo(sock string, r ctlReq) (int, []byte, error) {
	var body io.Reader
	if r.body != nil {
		b, _ := json.Marshal(r.body)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(r.method, "http://fakesnapd"+r.path, body)
	if err != nil {
		return 0, nil, err
	}
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}, Timeout: 10 * time.Minute}
	rsp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer rsp.Body.Close()
	b, err := io.ReadAll(rsp.Body)
	return rsp.StatusCode, b, err
}
