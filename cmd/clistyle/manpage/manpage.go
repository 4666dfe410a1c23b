// Package manpage writes the man pages of a command styled by clistyle:
// a page (section 1) per command, from the same definitions as the help
// and the completion. It is cobra/doc's, and so go-md2man's: importing it
// adds a hidden "man DIR" command to every root clistyle.Apply styles,
// in the builds that import it and only there. The shipped binaries do
// not: each main package imports it from a file built with the manpages
// tag (the release builds the pages with "go build -tags manpages" and
// ships the binaries built without), and from a test file.
//
//	go run -tags manpages ./cmd/snapsvc man ./man && man -l ./man/snapsvc.1
//
// Like clistyle it is public only for the etcd commands' module, and not
// a stable API.
package manpage

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
)

func init() {
	clistyle.Extend(func(root *cobra.Command) { root.AddCommand(Command(root)) })
}

// Command is the "man DIR" command: it writes the man pages of every
// command of root into DIR (Write). It is hidden: no page lists it, as
// the shipped binary has no such command.
func Command(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "man DIR",
		Short: "Write a man page for every command into DIR",
		Long: `The man command writes a man page (section 1) for every command into DIR,
from the same definitions as the help; the packages install them. Only a
build with the manpages tag has it.`,
		Example: "  go run -tags manpages ./cmd/" + root.Name() + " man ./man && man -l ./man/" + root.Name() + ".1",
		Hidden:  true,
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return Write(root, args[0])
		},
	}
}

// Write writes a man page (section 1) for every available command of
// root into dir, named as cobra names them (NAME-SUB.1): each titled by its
// own name (SNAPSVC-RESTART(1)), with a short footer (the binary and its
// version, the build's date; a long version string overprinted the date
// and title), the synopsis as the help writes it (markdown ate its
// brackets), each command's Example under EXAMPLES, and its
// clistyle.ManLong annotation, when set, as its description.
func Write(root *cobra.Command, dir string) error {
	return write(root, dir, clistyle.ReadBuild())
}

// write is Write for build b.
func write(root *cobra.Command, dir string, b clistyle.Build) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	manLong(root)
	completionExamples(root)
	root.DisableAutoGenTag = true
	hdr := doc.GenManHeader{Section: "1", Source: root.Name() + " " + strings.TrimPrefix(b.Version, "v"), Manual: "User Commands"}
	if t, err := time.Parse(time.RFC3339, b.Time); err == nil {
		hdr.Date = &t
	}
	return writeManTree(root, hdr, dir)
}

// writeManTree writes c's page and those of its available commands.
func writeManTree(c *cobra.Command, hdr doc.GenManHeader, dir string) error {
	for _, sub := range c.Commands() {
		if !sub.IsAvailableCommand() || sub.IsAdditionalHelpTopicCommand() {
			continue
		}
		if err := writeManTree(sub, hdr, dir); err != nil {
			return err
		}
	}
	page, err := manPage(c, hdr)
	if err != nil {
		return err
	}
	name := strings.ReplaceAll(c.CommandPath(), " ", "-") + "." + hdr.Section
	return os.WriteFile(filepath.Join(dir, name), page, 0o644)
}

// manPage is c's page. hdr is a copy: GenMan fills in the title, which is
// the command's own.
func manPage(c *cobra.Command, hdr doc.GenManHeader) ([]byte, error) {
	// The synopsis goes through markdown, where "[--flag] (A | B)" is a
	// link: escape what markdown would take, for the page only.
	use := c.Use
	defer func() { c.Use = use }()
	c.Use = markdownEscaper.Replace(use)
	var buf bytes.Buffer
	if err := doc.GenMan(c, &hdr, &buf); err != nil {
		return nil, err
	}
	// man-pages(7) calls the section EXAMPLES; cobra writes EXAMPLE.
	return bytes.ReplaceAll(buf.Bytes(), []byte("\n.SH EXAMPLE\n"), []byte("\n.SH EXAMPLES\n")), nil
}

// markdownEscaper escapes the characters markdown gives a meaning to in a
// synopsis: links ([...](...)), emphasis (*, _), code (`).
var markdownEscaper = strings.NewReplacer(`[`, `\[`, `]`, `\]`, `(`, `\(`, `)`, `\)`, `*`, `\*`, `_`, `\_`, "`", "\\`", `<`, `\<`, `>`, `\>`)

// completionExamples gives cobra's completion commands, which have none,
// an example each, for their man pages.
func completionExamples(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	name := root.Name()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		if c.Example == "" {
			c.Example = "  " + name + " completion bash > /etc/bash_completion.d/" + name + "\n  " + name + " completion zsh > \"${fpath[1]}/_" + name + "\"\n  " + name + " completion fish > ~/.config/fish/completions/" + name + ".fish"
		}
		for _, sub := range c.Commands() {
			if sub.Example != "" {
				continue
			}
			switch sub.Name() {
			case "bash":
				sub.Example = "  source <(" + name + " completion bash)                  # this shell\n  " + name + " completion bash > /etc/bash_completion.d/" + name + "   # every new one"
			case "zsh":
				sub.Example = "  " + name + " completion zsh > \"${fpath[1]}/_" + name + "\""
			case "fish":
				sub.Example = "  " + name + " completion fish > ~/.config/fish/completions/" + name + ".fish"
			case "powershell":
				sub.Example = "  " + name + " completion powershell | Out-String | Invoke-Expression"
			}
		}
	}
}

// manLong puts each command's ManLong annotation in place of its Long.
func manLong(c *cobra.Command) {
	if long := c.Annotations[clistyle.ManLong]; long != "" {
		c.Long = long
	}
	for _, sub := range c.Commands() {
		manLong(sub)
	}
}
