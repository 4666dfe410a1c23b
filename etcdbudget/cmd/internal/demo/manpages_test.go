package demo

// The tests' rollout-demo has the man command that the release's build
// for man pages has (rollout-demo/manpages.go), to check the pages.
import _ "github.com/snapsvc/snapsvc/cmd/clistyle/manpage"
