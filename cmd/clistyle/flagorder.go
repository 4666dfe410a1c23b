package clistyle

import (
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commandFirst returns args with the flags given before the command's name
// moved after it, when one of them is the command's own rather than the
// root's: "snapsvc --no-wait restart k8s" runs as "snapsvc restart
// --no-wait k8s". Cobra finds the command past the flags before it, but
// takes a flag it does not know there to have a value: it read "restart"
// as --no-wait's value and "k8s" as an unknown command. (A command's flag
// with a value, "-n 3 logs", already worked so.) The command is the first
// word naming one of root's commands that every word before it reads as
// flags of, and values for: the root's flags, the command's, or flags
// neither knows, which the command's own parsing then refuses by name
// ("unknown flag: --bogus"). Anything else is left as it is, for cobra.
func commandFirst(root *cobra.Command, args []string) []string {
	for j, arg := range args {
		if arg == "--" {
			break
		}
		sub := command(root, arg)
		if sub == nil {
			continue
		}
		own, ok := readFlags(root, sub, args[:j])
		if !ok {
			continue
		}
		if !own {
			break // only the root's flags: cobra reads them where they are
		}
		out := make([]string, 0, len(args))
		out = append(out, arg)
		out = append(out, args[:j]...)
		return append(out, args[j+1:]...)
	}
	return args
}

// command is root's command called name ("" if none).
func command(root *cobra.Command, name string) *cobra.Command {
	if strings.HasPrefix(name, "-") {
		return nil
	}
	for _, c := range root.Commands() {
		if c.Name() == name || c.HasAlias(name) {
			return c
		}
	}
	return nil
}

// readFlags reads words as flags (and their values) before sub's name: ok
// when each is a flag or a flag's value; own when one of them is not a
// persistent flag of root (sub's own, or unknown). A flag only root has
// (--version) is not sub's: then not ok, and the words stay where they
// are.
func readFlags(root, sub *cobra.Command, words []string) (own, ok bool) {
	lookup := func(name string, short bool) (f *pflag.Flag, rootOnly bool) {
		find := func(fs *pflag.FlagSet) *pflag.Flag {
			if short {
				return fs.ShorthandLookup(name)
			}
			return fs.Lookup(name)
		}
		if f := find(root.PersistentFlags()); f != nil {
			return f, false
		}
		if f := find(sub.Flags()); f != nil {
			own = true
			return f, false
		}
		if f := find(root.LocalNonPersistentFlags()); f != nil {
			return f, true
		}
		own = true // unknown: sub's parsing names it
		return nil, false
	}
	for i := 0; i < len(words); i++ {
		w := words[i]
		if len(w) < 2 || w[0] != '-' || w == "--" {
			return own, false
		}
		takesValue := false
		if name, ok := strings.CutPrefix(w, "--"); ok {
			name, _, hasValue := strings.Cut(name, "=")
			f, rootOnly := lookup(name, false)
			if rootOnly {
				return own, false
			}
			takesValue = f != nil && f.NoOptDefVal == "" && !hasValue
		} else {
			letters := w[1:]
			for k := 0; k < len(letters); k++ {
				if letters[k] == '=' {
					break // "-n=3": the rest is the value
				}
				f, rootOnly := lookup(letters[k:k+1], true)
				if rootOnly {
					return own, false
				}
				if f != nil && f.NoOptDefVal == "" {
					// "-n3": the rest is the value; "-n": the next word.
					takesValue = k == len(letters)-1
					break
				}
			}
		}
		if takesValue {
			if i+1 == len(words) {
				return own, false // the command's name would be the value
			}
			i++
		}
	}
	return own, true
}
