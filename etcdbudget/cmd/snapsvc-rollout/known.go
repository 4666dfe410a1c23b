package main

// Known keys: a key that nothing has ever used is most likely a typo.
// kubectl answers a write to an object that does not exist with
// `Error from server (NotFound): nodes "nodee" not found` (exit 1) and
// creates only when asked (kubectl create); etcdctl's writes to a user,
// role or lease that does not exist fail the same way ("etcdserver: user
// name not found", exit 1). So pause and resume of an unknown key fail,
// name the key, the keys it resembles and how to pause it on purpose
// (pause --create); status and history, reads as etcdctl get is, say it
// on stderr and go on.

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
)

// exitNotFound is an operator command's exit code for a key nothing has
// used (kubectl's NotFound, etcdctl's "not found": both exit 1).
const exitNotFound = 1

// unknownKeyError is a key that nothing has used under the prefix.
type unknownKeyError struct {
	key, prefix string
	known       []string // every key in use, sorted
	near        []string // the known keys (or their snaps) it resembles
	cmd         string   // the command refused ("pause", "resume"), "" for a read
}

func (e *unknownKeyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "budget key %q not found under %s (nothing has used it: no holder, waiter, pause or history)", e.key, e.prefix)
	switch {
	case len(e.near) > 0:
		fmt.Fprintf(&b, ". Did you mean %s?", orList(e.near))
	case len(e.known) == 0:
		b.WriteString(". No key has been used under this prefix at all: is --prefix right?")
	default:
		const show = 8
		fmt.Fprintf(&b, ". Keys in use: %s", strings.Join(e.known[:min(len(e.known), show)], ", "))
		if n := len(e.known) - show; n > 0 {
			fmt.Fprintf(&b, " and %d more (snapsvc-rollout list)", n)
		}
		b.WriteString(".")
	}
	switch e.cmd {
	case "pause":
		fmt.Fprintf(&b, " Nothing was written; to pause a key before its first rollout: snapsvc-rollout pause --create %s", e.key)
	case "resume":
		b.WriteString(" Nothing was written.")
	}
	return b.String()
}

// orList is "a", "a or b", "a, b or c".
func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// keysInUse reads the keys that anything uses under the prefix
// (etcdbudget's Keys), with the snaps and parts whose pause holds them
// (budget.PauseScopes): a pause of "k8s" holds "k8s.kubelet".
func keysInUse(ctx context.Context, b *etcdbudget.Budget) (keys, scopes []string, err error) {
	keys, err = b.Keys(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, k := range keys {
		for _, s := range budget.PauseScopes(k) {
			if !slices.Contains(scopes, s) {
				scopes = append(scopes, s)
			}
		}
	}
	sort.Strings(scopes)
	return keys, scopes, nil
}

// unknownKey returns an *unknownKeyError when key (canonical) is neither
// in use nor the snap or part of a key in use, else nil.
func unknownKey(key, prefix, cmd string, keys, scopes []string) error {
	key = etcdbudget.Key(key)
	if slices.Contains(scopes, key) {
		return nil
	}
	return &unknownKeyError{key: key, prefix: prefix, known: keys, near: nearKeys(key, scopes), cmd: cmd}
}

// nearKeys are the candidates within a small edit distance of key (a
// typo: at most 2 edits, 1 for keys of 4 characters or fewer), or that
// key is the start of, closest first.
func nearKeys(key string, candidates []string) []string {
	type near struct {
		k string
		d int
	}
	var ns []near
	limit := 2
	if len([]rune(key)) <= 4 {
		limit = 1
	}
	for _, c := range candidates {
		d := editDistance(strings.ToLower(key), strings.ToLower(c))
		if d <= limit || (len(key) >= 3 && strings.HasPrefix(c, key)) {
			ns = append(ns, near{c, d})
		}
	}
	sort.SliceStable(ns, func(i, j int) bool { return ns[i].d < ns[j].d })
	var out []string
	for _, n := range ns[:min(len(ns), 5)] {
		out = append(out, n.k)
	}
	return out
}

// editDistance is the Levenshtein distance of a and b (in runes).
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// completeTimeout bounds reading the keys for a shell completion: a
// completion that waits on an unreachable etcd would hang the shell.
const completeTimeout = time.Second

// completeKeys is the completion of an operator command's KEY argument
// (arg) or of --budget-key: the keys in use, read from etcd with the
// command line's etcd flags and etcdctl's variables within
// completeTimeout; with scopes, also the snaps and parts whose pause holds
// them (for pause). Nothing when etcd cannot be read in time (the error
// as cobra's active help, shown where the shell and
// SNAPSVC_ROLLOUT_ACTIVE_HELP allow).
func completeKeys(o *options, scopes, arg bool) cobra.CompletionFunc {
	return func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if (arg && len(args) > 0) || fromEnv(c.Flags(), o) != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx := c.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		ctx, cancel := context.WithTimeout(ctx, completeTimeout)
		defer cancel()
		co := *o
		co.dialTimeout = min(o.dialTimeout, completeTimeout)
		cli, err := etcdClient(&co)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer cli.Close()
		b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Prefix: o.prefix, Unreachable: completeTimeout, Attempt: completeTimeout})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		keys, inUse, err := keysInUse(ctx, b)
		if err != nil {
			return cobra.AppendActiveHelp(nil, "cannot read the keys from etcd: "+err.Error()), cobra.ShellCompDirectiveNoFileComp
		}
		if scopes {
			keys = inUse
		}
		var out []cobra.Completion
		for _, k := range keys {
			if strings.HasPrefix(k, toComplete) {
				out = append(out, k)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
