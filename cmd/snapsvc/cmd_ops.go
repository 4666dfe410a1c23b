package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

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

const opNames = `NAME is a snap ("k8s": all its services) or a service ("k8s.kubelet").

Like snap, it prints one word once the change is done; with --no-wait the
change's id alone, for "snapsvc watch ID". Changes that hold the snap
(a "snap set", a refresh) are waited out first.`

func (a *app) startCmd() *cobra.Command {
	var enable bool
	c := &cobra.Command{
		Use: "start [--enable] [--no-wait] NAME...",
		Example: `  snapsvc start k8s                    # every service of k8s
  snapsvc start --enable k8s.kubelet   # and start it at boot`,
		Short: "Start services",
		Long:  "The start command starts, and optionally enables, the given services.\n\n" + opNames,
		Args:  needNames("start"),
		RunE: func(c *cobra.Command, names []string) error {
			return a.do(c, func(ctx context.Context) error {
				return a.operate(ctx, "start", names, func(cl *snapsvc.Client) (*snapsvc.Operation, error) {
					return cl.StartAsync(ctx, names, snapsvc.StartOptions{Enable: enable})
				})
			})
		},
		ValidArgsFunction: a.completeNames,
	}
	c.Flags().BoolVar(&enable, "enable", false, "as well as starting the services now, arrange for them to be started on boot")
	c.Flags().BoolVar(&a.noWait, "no-wait", false, "do not wait for the change: print its id and return")
	return c
}

func (a *app) stopCmd() *cobra.Command {
	var disable bool
	c := &cobra.Command{
		Use: "stop [--disable] [--no-wait] NAME...",
		Example: `  snapsvc stop k8s.kubelet
  snapsvc stop --disable k8s.kubelet   # and not at boot either`,
		Short: "Stop services",
		Long:  "The stop command stops, and optionally disables, the given services.\n\n" + opNames,
		Args:  needNames("stop"),
		RunE: func(c *cobra.Command, names []string) error {
			return a.do(c, func(ctx context.Context) error {
				return a.operate(ctx, "stop", names, func(cl *snapsvc.Client) (*snapsvc.Operation, error) {
					return cl.StopAsync(ctx, names, snapsvc.StopOptions{Disable: disable})
				})
			})
		},
		ValidArgsFunction: a.completeNames,
	}
	c.Flags().BoolVar(&disable, "disable", false, "as well as stopping the services now, arrange for them to no longer be started on boot")
	c.Flags().BoolVar(&a.noWait, "no-wait", false, "do not wait for the change: print its id and return")
	return c
}

func (a *app) restartCmd() *cobra.Command {
	var reload bool
	c := &cobra.Command{
		Use: "restart [--reload] [--no-wait] NAME...",
		Example: `  snapsvc restart k8s.kubelet
  snapsvc restart --reload k8s.k8sd            # reload where the app can
  id=$(snapsvc restart --no-wait k8s); snapsvc watch "$id"`,
		Short: "Restart services",
		Long:  "The restart command restarts the given services.\n\nIf the --reload option is given, for each service whose app has a reload\ncommand, a reload is performed instead of a restart.\n\n" + opNames,
		Args:  needNames("restart"),
		RunE: func(c *cobra.Command, names []string) error {
			return a.do(c, func(ctx context.Context) error {
				return a.operate(ctx, "restart", names, func(cl *snapsvc.Client) (*snapsvc.Operation, error) {
					return cl.RestartAsync(ctx, names, snapsvc.RestartOptions{Reload: reload})
				})
			})
		},
		ValidArgsFunction: a.completeNames,
	}
	c.Flags().BoolVar(&reload, "reload", false, "if the service has a reload command, use it instead of restarting")
	c.Flags().BoolVar(&a.noWait, "no-wait", false, "do not wait for the change: print its id and return")
	return c
}

// done is what snap prints once a service command's change is done.
var done = map[string]string{"start": "Started.", "stop": "Stopped.", "restart": "Restarted."}

// operate runs one service command: submit (the library waits out
// conflicts), then, unless noWait, wait for the change with progress.
func (a *app) operate(ctx context.Context, action string, names []string, submit func(*snapsvc.Client) (*snapsvc.Operation, error)) error {
	if err := checkNames(names); err != nil {
		return err
	}
	noWait := a.noWait
	c, err := a.client()
	if err != nil {
		return err
	}
	defer c.Close()
	a.prog.begin(action + " " + strings.Join(names, " "))
	a.prog.lookup(c)
	op, err := submit(c)
	if err != nil {
		return err
	}
	// What the submit did (attempts, conflicts absorbed, changes waited
	// for) is known now, waiting or not; waiting adds the final status.
	res := op.Result()
	if !noWait {
		if id := res.ChangeID; id != "" {
			a.prog.waitFor(id, "service-control")
		}
		final, err := op.Wait(ctx)
		a.prog.end()
		if err != nil {
			return err
		}
		res = *final
	} else if final, err := op.Wait(doneContext(ctx)); err == nil {
		// Wait on a finished operation returns at once (snapctl and
		// queued-in-hook operations are final when submitted).
		res = *final
	}
	a.prog.end()
	out := opOutput{
		Action: action, Names: names, Change: res.ChangeID, Status: res.Status, Queued: res.Queued,
		Waited: !noWait, Attempts: res.Attempts, Conflicts: res.Conflicts,
		WaitedFor: append([]string{}, res.WaitedFor...),
	}
	if a.json {
		a.printJSON(out)
		return nil
	}
	if len(out.WaitedFor) > 0 && a.chatty() {
		a.note("waited for change %s holding the snap (%d conflict(s) absorbed)", strings.Join(out.WaitedFor, ", "), out.Conflicts)
	}
	switch {
	case out.Queued:
		a.note("%s %s: queued by snapd until the running hook ends", action, strings.Join(names, " "))
	case noWait && out.Change != "":
		// The bare id, as snap and pebble print it: id=$(snapsvc
		// restart --no-wait k8s); snapsvc watch "$id".
		fmt.Fprintln(a.stdout, out.Change)
	case !noWait:
		fmt.Fprintln(a.stdout, done[action])
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

// completeSnaps completes the one SNAP of changes and wait-idle: the
// snaps with services snapd lists, when it answers within a second (snap
// completes every installed snap; snapsvc's commands are about services).
func (a *app) completeSnaps(c *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	svcs, _ := completionRead(c, a, func(ctx context.Context, cl *snapsvc.Client) ([]snapsvc.Service, error) {
		return cl.Services(ctx)
	})
	var out []string
	seen := map[string]bool{}
	for _, s := range svcs {
		if !seen[s.Snap] && strings.HasPrefix(s.Snap, prefix) {
			seen[s.Snap] = true
			out = append(out, s.Snap)
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeNames completes service names from snapd, when it answers
// within a second.
func (a *app) completeNames(c *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
	svcs, err := completionRead(c, a, func(ctx context.Context, cl *snapsvc.Client) ([]snapsvc.Service, error) {
		return cl.Services(ctx)
	})
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	seen := map[string]bool{}
	for _, s := range svcs {
		for _, n := range []string{s.Snap, s.FullName()} {
			if !seen[n] && strings.HasPrefix(n, prefix) {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
