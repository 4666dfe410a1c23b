package main

import (
	"github.com/spf13/cobra"

	"context"
	"fmt"
	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// versionOutput is version's --json shape.
type versionOutput struct {
	Snapsvc clistyle.Build `json:"snapsvc"`
	Snapd   snapdVersion   `json:"snapd"`
}

// snapdVersion is snapd's version, or why it could not be read.
type snapdVersion struct {
	Socket  string `json:"socket"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

// snapdVersionWait bounds the one request version makes to snapd.
const snapdVersionWait = 5 * time.Second

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show version details",
		Long: `The version command prints snapsvc's version (as --version does) and snapd's,
when snapd answers within 5 seconds, as snap version does.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return a.do(c, func(ctx context.Context) error {
				out := versionOutput{Snapsvc: clistyle.ReadBuild(), Snapd: a.snapdVersion(ctx)}
				if a.json {
					a.printJSON(out)
					return nil
				}
				fmt.Fprintln(a.stdout, out.Snapsvc.Line("snapsvc"))
				if out.Snapd.Error != "" {
					fmt.Fprintf(a.stdout, "snapd: unknown (%s)\n", out.Snapd.Error)
				} else {
					fmt.Fprintf(a.stdout, "snapd %s at %s\n", out.Snapd.Version, out.Snapd.Socket)
				}
				return nil
			})
		},
	}
}

// snapdVersion asks snapd its version, once: snapd being unreachable is
// an answer here, not a failure.
func (a *app) snapdVersion(ctx context.Context) snapdVersion {
	out := snapdVersion{Socket: a.socketPath()}
	ctx, cancel := context.WithTimeout(ctx, snapdVersionWait)
	defer cancel()
	c := snapd.New(out.Socket)
	defer c.CloseIdleConnections()
	info, err := c.SystemInfo(ctx)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Version = info.Version
	return out
}
