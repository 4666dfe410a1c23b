package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
)

func (a *app) servicesCmd() *cobra.Command {
	return &cobra.Command{
		Use: "services [SNAP|SNAP.APP...]",
		Example: `  snapsvc services                       # every service of every snap
  snapsvc services --json k8s.kubelet`,
		Short: "Query the status of services",
		Long: `The services command lists information about the services specified, or about
the services in all currently installed snaps, as snap services does
(Service, Startup, Current, Notes).`,
		ValidArgsFunction: a.completeNames,
		RunE: func(c *cobra.Command, names []string) error {
			return a.do(c, func(ctx context.Context) error {
				if err := checkNames(names); err != nil {
					return err
				}
				cl, err := a.client()
				if err != nil {
					return err
				}
				defer cl.Close()
				svcs, err := cl.Services(ctx, names...)
				if err != nil {
					return err
				}
				if a.json {
					a.printJSON(svcs)
					return nil
				}
				if len(svcs) == 0 {
					fmt.Fprintln(a.stderr, "There are no services provided by installed snaps.")
					return nil
				}
				tw := a.table()
				fmt.Fprintln(tw, "Service\tStartup\tCurrent\tNotes")
				for _, s := range svcs {
					startup, current := serviceState(s)
					fmt.Fprintf(tw, "%s\t%s\t%s\t-\n", s.FullName(), startup, current)
				}
				return tw.Flush()
			})
		},
	}
}
