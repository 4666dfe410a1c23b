//go:build manpages

package main

// The man command ("snapsvc man DIR"), in the release's build for man pages
// only: its generator (cobra/doc, go-md2man) is not linked into the
// shipped binary. See package manpage.
import _ "github.com/snapsvc/snapsvc/cmd/clistyle/manpage"
