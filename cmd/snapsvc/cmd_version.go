package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/snapsvc"
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
		Use: "version",
		Example: `  snapsvc version
  SNAPPY_GLOBAL_ROOT=/tmp/root snapsvc version --json   # a fakesnapd --root /tmp/root`,
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

// snapdVersion asks snapd its version, once, at the socket every other
// command uses ($SNAPPY_GLOBAL_ROOT included): snapd being unreachable is
// an answer here, not a failure, said in a few words.
func (a *app) snapdVersion(ctx context.Context) snapdVersion {
	out := snapdVersion{Socket: a.socketPath()}
	ctx, cancel := context.WithTimeout(ctx, snapdVersionWait)
	defer cancel()
	c := a.wire(out.Socket)
	defer c.Close()
	info, err := c.SystemInfo(ctx)
	if err != nil {
		out.Error = a.versionError(err)
		return out
	}
	out.Version = info.Version
	return out
}

// wire is a wire client of socket, for the requests the library does not
// make (system-info, logs), judging a missing socket as the library does:
// snapd not installed, or under $SNAPPY_GLOBAL_ROOT a missing directory.
func (a *app) wire(socket string) *snapd.Client {
	c := snapd.New(socket)
	switch {
	case a.snapdRoot != "":
		c.CheckInstalled(a.snapdRoot)
	case socket == snapd.DefaultSocket || socket == snapd.DefaultSnapSocket:
		c.CheckInstalled("/")
	case a.socket == "" && a.getenv(snapsvc.EnvRoot) != "":
		c.CheckServed() // as the library judges a socket under the root
	}
	return c
}

// versionError says why snapd's version is unknown in a few words: not
// installed, unreachable and why, or what snapd answered.
func (a *app) versionError(err error) string {
	var ni *snapsvc.NotInstalledError
	var ce *snapsvc.ConnectionError
	var se *snapd.SocketError
	switch {
	case errors.As(err, &ni):
		return ni.Error()
	case errors.As(err, &se):
		return fmt.Sprintf("cannot reach snapd at %s: it %s", se.Socket, se.Problem)
	case errors.As(err, &ce) && !ce.Connected:
		return fmt.Sprintf("cannot reach snapd at %s: %s", ce.Socket, dialReason(ce))
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("no answer within %v", snapdVersionWait)
	}
	return plain(err)
}
