package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// opOutput is the --json shape of start, stop and restart.
type opOutput struct {
	Action    string   `json:"action"`
	Names     []string `json:"names"`
	Change    string   `json:"change,omitempty"`
	Status    string   `json:"status,omitempty"`
	Queued    bool     `json:"queued,omitempty"`
	Waited    bool     `json:"waited"`
	Attempts  int      `json:"attempts"`
	Conflicts int      `json:"conflicts"`
	WaitedFor []string `json:"waited-for"`
}

func cmdStart(a *app, args []string) (action, error) {
	fs := a.flagSet("start")
	enable := fs.Bool("enable", false, "also enable the services (start at boot)")
	noWait := fs.Bool("no-wait", false, "return once snapd accepted the request; print the change id")
	names, err := a.parseCommand(fs, "start", args)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return a.operate(ctx, "start", names, *noWait, func(c *snapsvc.Client) (*snapsvc.Operation, error) {
			return c.StartAsync(ctx, names, snapsvc.StartOptions{Enable: *enable})
		})
	}, nil
}

func cmdStop(a *app, args []string) (action, error) {
	fs := a.flagSet("stop")
	disable := fs.Bool("disable", false, "also disable the services (stay stopped at boot)")
	noWait := fs.Bool("no-wait", false, "return once snapd accepted the request; print the change id")
	names, err := a.parseCommand(fs, "stop", args)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return a.operate(ctx, "stop", names, *noWait, func(c *snapsvc.Client) (*snapsvc.Operation, error) {
			return c.StopAsync(ctx, names, snapsvc.StopOptions{Disable: *disable})
		})
	}, nil
}

func cmdRestart(a *app, args []string) (action, error) {
	fs := a.flagSet("restart")
	reload := fs.Bool("reload", false, "reload services that support it instead of restarting them")
	noWait := fs.Bool("no-wait", false, "return once snapd accepted the request; print the change id")
	names, err := a.parseCommand(fs, "restart", args)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return a.operate(ctx, "restart", names, *noWait, func(c *snapsvc.Client) (*snapsvc.Operation, error) {
			return c.RestartAsync(ctx, names, snapsvc.RestartOptions{Reload: *reload})
		})
	}, nil
}

// operate runs one service command: submit (the library waits out
// conflicts), then, unless noWait, wait for the change with progress.
func (a *app) operate(ctx context.Context, action string, names []string, noWait bool, submit func(*snapsvc.Client) (*snapsvc.Operation, error)) error {
	if len(names) == 0 {
		return usagef("%s needs at least one snap or service name", action)
	}
	for _, n := range names {
		if _, _, err := snapsvc.ValidateName(n); err != nil {
			return err
		}
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	defer c.Close()
	a.prog.set(fmt.Sprintf("%s %s: asking snapd", action, strings.Join(names, " ")))
	op, err := submit(c)
	if err != nil {
		a.prog.clear()
		return err
	}
	// What the submit did (attempts, conflicts absorbed, changes waited
	// for) is known now, waiting or not; waiting adds the final status.
	res := op.Result()
	if !noWait {
		if id := res.ChangeID; id != "" {
			a.prog.follow(a.followChange(ctx, func(ctx context.Context) (string, error) {
				chg, err := c.Change(ctx, id)
				if err != nil {
					return "", err
				}
				return describeChange(chg), nil
			}))
		}
		final, err := op.Wait(ctx)
		a.prog.clear()
		if err != nil {
			return err
		}
		res = *final
	} else if final, err := op.Wait(doneContext(ctx)); err == nil {
		// Wait on a finished operation returns at once (snapctl and
		// queued-in-hook operations are final when submitted).
		res = *final
	}
	a.prog.clear()
	out := opOutput{
		Action: action, Names: names, Change: res.ChangeID, Status: res.Status, Queued: res.Queued,
		Waited: !noWait, Attempts: res.Attempts, Conflicts: res.Conflicts,
		WaitedFor: append([]string{}, res.WaitedFor...),
	}
	if a.json {
		a.printJSON(out)
		return nil
	}
	what := action + " " + strings.Join(names, " ")
	switch {
	case out.Queued:
		fmt.Fprintf(a.stdout, "%s: queued by snapd until the running hook ends\n", what)
	case !out.Waited && out.Change != "":
		fmt.Fprintf(a.stdout, "%s: change %s accepted (not waiting)\n", what, out.Change)
	case out.Change != "":
		fmt.Fprintf(a.stdout, "%s: change %s %s\n", what, out.Change, out.Status)
	default:
		fmt.Fprintf(a.stdout, "%s: %s\n", what, out.Status)
	}
	if len(out.WaitedFor) > 0 {
		fmt.Fprintf(a.stdout, "waited for change %s holding the snap (%d conflict(s) absorbed)\n", strings.Join(out.WaitedFor, ", "), out.Conflicts)
	}
	return nil
}

// doneContext is a context that is already cancelled: waiting with it only
// succeeds for an operation that is already final.
func doneContext(ctx context.Context) context.Context {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cancel()
	return ctx
}
