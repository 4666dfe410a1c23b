package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// versionOutput is version's --json shape.
type versionOutput struct {
	Snapsvc buildVersion `json:"snapsvc"`
	Snapd   snapdVersion `json:"snapd"`
}

// buildVersion is what the binary knows of its own build.
type buildVersion struct {
	// Module is the module path, Version its version ("(devel)" for a
	// build from a checkout without version control information).
	Module   string `json:"module"`
	Version  string `json:"version"`
	Go       string `json:"go"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// snapdVersion is snapd's version, or why it could not be read.
type snapdVersion struct {
	Socket  string `json:"socket"`
	Version string `json:"version,omitempty"`
	Error   string `json:"error,omitempty"`
}

// snapdVersionWait bounds the one request version makes to snapd.
const snapdVersionWait = 5 * time.Second

func cmdVersion(a *app, args []string) (action, error) {
	fs := a.flagSet("version")
	pos, err := a.parseCommand(fs, "version", args)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, usagef("version takes no arguments, got %q", pos[0])
	}
	return func(ctx context.Context) error {
		out := versionOutput{Snapsvc: readBuildVersion(), Snapd: a.snapdVersion(ctx)}
		if a.json {
			a.printJSON(out)
			return nil
		}
		b := out.Snapsvc
		var extra []string
		extra = append(extra, b.Module, b.Go)
		if b.Revision != "" {
			extra = append(extra, "revision "+b.Revision)
		}
		if b.Time != "" {
			extra = append(extra, b.Time)
		}
		if b.Modified {
			extra = append(extra, "modified")
		}
		fmt.Fprintf(a.stdout, "snapsvc %s (%s)\n", b.Version, strings.Join(extra, ", "))
		if out.Snapd.Error != "" {
			fmt.Fprintf(a.stdout, "snapd: unknown (%s)\n", out.Snapd.Error)
		} else {
			fmt.Fprintf(a.stdout, "snapd %s at %s\n", out.Snapd.Version, out.Snapd.Socket)
		}
		return nil
	}, nil
}

// readBuildVersion reads the module's version from the binary's build
// information.
func readBuildVersion() buildVersion {
	v := buildVersion{Module: "github.com/snapsvc/snapsvc", Version: "(devel)", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
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
