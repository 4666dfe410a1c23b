package etcdbudget_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
)

// A holder process is this test binary re-executed with holderEnv set: it
// takes a slot, prints {"ev":"acquired"}, and then obeys one command per
// line on stdin: "fence" (prints {"ev":"fence","err":...,"lost":...,
// "valid":...}), "act" (prints {"ev":"act"}: the moment its request would
// be written), "ready" (MarkReady; prints {"ev":"ready"}), "release"
// (prints {"ev":"released"}). It lets tests pause (SIGSTOP) or
// kill -9 a holder whose slot lives in etcd.

const holderEnv = "ETCDBUDGET_TEST_HOLDER"

type holderConfig struct {
	Endpoints []string      `json:"endpoints"`
	Key       string        `json:"key"`
	Name      string        `json:"name"`
	TTL       time.Duration `json:"ttl"`
	LockDelay time.Duration `json:"lock-delay"`
}

type holderEvent struct {
	Ev          string        `json:"ev"`
	T           time.Time     `json:"t"`
	Err         string        `json:"err,omitempty"`
	LostBefore  bool          `json:"lost-before,omitempty"` // Lost was closed before Fence ran
	Lost        bool          `json:"lost,omitempty"`        // Fence's error wraps ErrSlotLost
	Unavailable bool          `json:"unavailable,omitempty"` // ... ErrBudgetUnavailable
	Start       time.Time     `json:"start,omitzero"`        // when Fence was called
	Valid       time.Duration `json:"valid,omitempty"`       // what Fence returned
}

func maybeRunHolder() {
	raw := os.Getenv(holderEnv)
	if raw == "" {
		return
	}
	var cfg holderConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := runHolder(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runHolder(cfg holderConfig) error {
	cli, err := newClient(cfg.Endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Holder: cfg.Name, TTL: cfg.TTL, LockDelay: cfg.LockDelay, Unreachable: 5 * time.Second})
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	ctx := context.Background()
	s, err := b.Acquire(ctx, cfg.Key, nil)
	if err != nil {
		return err
	}
	enc.Encode(holderEvent{Ev: "acquired", T: time.Now()})
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "fence":
			ev := holderEvent{Ev: "fence"}
			select {
			case <-s.Lost():
				ev.LostBefore = true
			default:
			}
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ev.Start = time.Now()
			valid, err := s.(budget.Fencer).Fence(fctx)
			cancel()
			ev.T = time.Now()
			ev.Valid, _ = valid.Duration()
			if err != nil {
				ev.Err = err.Error()
				ev.Lost = errors.Is(err, budget.ErrSlotLost)
				ev.Unavailable = errors.Is(err, budget.ErrUnavailable)
			}
			enc.Encode(ev)
		case "ready":
			err := s.(budget.Readier).MarkReady(ctx)
			ev := holderEvent{Ev: "ready", T: time.Now()}
			if err != nil {
				ev.Err = err.Error()
			}
			enc.Encode(ev)
		case "act":
			// What the core does right after a fence: send its request
			// (here only the moment is reported; the test's site acts).
			enc.Encode(holderEvent{Ev: "act", T: time.Now()})
		case "release":
			err := s.Release(ctx)
			ev := holderEvent{Ev: "released", T: time.Now()}
			if err != nil {
				ev.Err = err.Error()
			}
			enc.Encode(ev)
		}
	}
	return nil
}

// holderProc is a running holder process seen from the test.
type holderProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan holderEvent
}

func startHolder(t *testing.T, cfg holderConfig) *holderProc {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holderProc{cmd: cmd, stdin: stdin, events: make(chan holderEvent, 100)}
	go func() {
		defer close(h.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev holderEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				h.events <- ev
			}
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Wait()
	})
	return h
}

func (h *holderProc) next(t *testing.T, ctx context.Context, kind string) holderEvent {
	t.Helper()
	for {
		select {
		case ev, ok := <-h.events:
			if !ok {
				t.Fatalf("holder ended before %q", kind)
			}
			if ev.Ev == kind {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("holder: no %q: %v", kind, ctx.Err())
		}
	}
}

func (h *holderProc) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(h.stdin, cmd); err != nil {
		t.Fatal(err)
	}
}
