package main

// The tests' snapsvc has the man command that the release's build for man
// pages has (manpages.go), to check the pages.
import _ "github.com/snapsvc/snapsvc/cmd/clistyle/manpage"
