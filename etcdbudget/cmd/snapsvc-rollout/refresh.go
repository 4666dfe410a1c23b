package main

import (
	"context"
	"errors"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// refreshOptions are the rollout's refresh flags: with --refresh the
// rollout refreshes the one snap it names (snapsvc.Client.Refresh) instead
// of restarting it, under the same budget, readiness checks, admission
// check and halt, so that a fleet refreshes at most --max machines at a
// time.
type refreshOptions struct {
	on                      bool
	channel, revision, file string
	amend, classic          bool
}

// refreshFlags adds the refresh flags to fs.
func refreshFlags(fs *pflag.FlagSet, r *refreshOptions) {
	fs.BoolVar(&r.on, "refresh", false, "refresh the snap named (one snap, as snap refresh does) instead of restarting: its slots held until its services are ready again")
	fs.StringVar(&r.channel, "channel", "", "with --refresh: refresh from this `CHANNEL`")
	fs.StringVar(&r.revision, "revision", "", "with --refresh: refresh to this `REVISION`")
	fs.StringVar(&r.file, "refresh-file", "", "with --refresh: install this local snap `FILE` as the new revision, as snap install --dangerous")
	fs.BoolVar(&r.amend, "amend", false, "with --refresh: allow a snap installed from a file to be refreshed from the store")
	fs.BoolVar(&r.classic, "classic", false, "with --refresh: the snap (or --refresh-file) is classically confined")
	fs.SetAnnotation("refresh-file", cobra.BashCompFilenameExt, []string{"snap"})
}

// validateRefresh checks the refresh flags against the rest of o.
func validateRefresh(o *options) error {
	r := o.refresh
	switch {
	case !r.on && (r.channel != "" || r.revision != "" || r.file != "" || r.amend || r.classic):
		return errors.New("--channel, --revision, --refresh-file, --amend and --classic go with --refresh")
	case !r.on:
		return nil
	case len(o.names) != 1 || strings.Contains(o.names[0], "."):
		return errors.New("--refresh takes exactly one snap name (not a service), e.g. k8s")
	case o.reload:
		return errors.New("--refresh takes no --reload")
	case r.file != "" && (r.channel != "" || r.revision != "" || r.amend):
		return errors.New("--refresh-file takes no --channel, --revision or --amend")
	}
	return nil
}

// act does the rollout's act on c: the refresh with --refresh, else the
// restart.
func (r refreshOptions) act(ctx context.Context, c *snapsvc.Client, o *options) (*snapsvc.Result, error) {
	if !r.on {
		return c.Restart(ctx, o.names, snapsvc.RestartOptions{Reload: o.reload})
	}
	res, err := c.Refresh(ctx, o.names[0], snapsvc.RefreshOptions{Channel: r.channel, Revision: r.revision, File: r.file, Amend: r.amend, Classic: r.classic})
	if err != nil {
		return nil, err
	}
	return &res.Result, nil
}
