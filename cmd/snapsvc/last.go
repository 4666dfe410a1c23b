package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// lastHelp is --last's help, snap's words.
const lastHelp = "select the last change of the given `KIND` (service-control, configure, install, refresh, auto-refresh, ...); a question mark at the end (quoted for the shell) means to do nothing, instead of failing, when there is no such change"

// shortKinds are the kinds snap lets one name without their "-snap"
// (cmd/snap/last.go changeIDMixin.GetChangeID).
var shortKinds = []string{"configure", "connect", "disconnect", "install", "refresh", "remove", "try"}

// errNoChangeOK is --last=KIND? finding no such change: the command does
// nothing and succeeds, as snap's.
var errNoChangeOK = errors.New("no change of that kind, and that is fine")

// notFoundError is a failure to find a change that matches
// snapsvc.ErrNotFound (exit 4).
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string        { return e.msg }
func (e *notFoundError) Is(target error) bool { return target == snapsvc.ErrNotFound }

// addLast gives c snap's --last=KIND, its value completed from the kinds
// of snapd's changes.
func (a *app) addLast(c *cobra.Command, last *string) {
	c.Flags().StringVar(last, "last", "", lastHelp)
	_ = c.RegisterFlagCompletionFunc("last", a.completeKinds)
}

// checkChangeArgs checks, before any request, that the command has a
// change id or --last, not both: snap's rules and words.
func checkChangeArgs(cmd string, pos []string, last string) error {
	switch {
	case len(pos) == 0 && last == "":
		return usagef("please provide change ID or type with --last=<type>")
	case len(pos) > 0 && last != "":
		return usagef("cannot use change ID and type together")
	case last == "?":
		return usagef("--last needs a change kind before the question mark")
	case len(pos) > 0:
		_, err := changeIDArg(cmd, pos)
		return err
	}
	return nil
}

// changeID is the change a command acts on: the id given, or the latest
// change of --last's kind, as snap finds it (every change snapd keeps;
// the short kinds get their "-snap"). It returns errNoChangeOK for
// --last=KIND? without one, a not-found error (exit 4) for --last=KIND.
func changeID(ctx context.Context, cl *snapsvc.Client, pos []string, last string) (string, error) {
	if last == "" {
		return pos[0], nil
	}
	kind, optional := strings.CutSuffix(last, "?")
	for _, k := range shortKinds {
		if kind == k {
			kind += "-snap"
		}
	}
	chgs, err := cl.Changes(ctx, snapsvc.ChangesOptions{Select: "all"})
	if err != nil {
		return "", err
	}
	var latest *snapsvc.Change
	for i := range chgs {
		if chgs[i].Kind == kind && (latest == nil || latest.SpawnTime.Before(chgs[i].SpawnTime)) {
			latest = &chgs[i]
		}
	}
	switch {
	case latest != nil:
		return latest.ID, nil
	case optional:
		return "", errNoChangeOK
	case len(chgs) == 0:
		return "", &notFoundError{"no changes found"}
	}
	return "", &notFoundError{fmt.Sprintf("no changes of type %q found", strings.TrimSuffix(last, "?"))}
}

// resolveChange is changeID for a command: ok is false, with null printed
// under --json, when --last=KIND? found no such change (the command then
// does nothing and succeeds).
func (a *app) resolveChange(ctx context.Context, cl *snapsvc.Client, pos []string, last string) (id string, ok bool, err error) {
	id, err = changeID(ctx, cl, pos, last)
	if errors.Is(err, errNoChangeOK) {
		if a.json {
			a.printJSON(nil)
		}
		return "", false, nil
	}
	return id, err == nil, err
}

// completionRead reads what a completion offers from snapd through a
// client of the command line's settings, giving snapd completionWait to
// answer.
func completionRead[T any](c *cobra.Command, a *app, read func(context.Context, *snapsvc.Client) ([]T, error)) ([]T, error) {
	ctx, cancel := context.WithTimeout(c.Context(), completionWait)
	defer cancel()
	cl, err := snapsvc.New(append(a.socketOpt(), snapsvc.WithPolicy(a.policy()))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	return read(ctx, cl)
}

// completeKinds completes --last with the kinds of snapd's changes and
// snap's short forms, when snapd answers within a second.
func (a *app) completeKinds(c *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	kinds := map[string]bool{}
	for _, k := range shortKinds {
		kinds[k] = true
	}
	chgs, _ := completionRead(c, a, func(ctx context.Context, cl *snapsvc.Client) ([]snapsvc.Change, error) {
		return cl.Changes(ctx, snapsvc.ChangesOptions{Select: "all"})
	})
	for _, chg := range chgs {
		kinds[chg.Kind] = true
	}
	var out []cobra.Completion
	for k := range kinds {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out, cobra.ShellCompDirectiveNoFileComp
}
