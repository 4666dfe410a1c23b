package main

import (
	"errors"
	"net"
	"net/url"
	"strings"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// causeText is err's whole text, every layer's words, for --json's cause
// and -v's detail line, on one line, without what a layer repeats of the
// connection the *snapsvc.ConnectionError around it names already (its
// socket, its request):
//
//	cannot communicate with snapd at /run/snapd.socket (POST /v2/apps, cannot
//	connect): socket /run/snapd.socket does not exist (is snapd running?):
//	Post "http://localhost/v2/apps": dial unix /run/snapd.socket: connect: no
//	such file or directory
//
// named the socket three times and the request twice; it reads
//
//	cannot communicate with snapd at /run/snapd.socket (POST /v2/apps, cannot
//	connect): the socket does not exist (is snapd running?): connect: no such
//	file or directory
//
// The library's own retryable markers go too (the verdict is the
// command's: --json's retryable).
func causeText(err error) string {
	s := err.Error()
	var ce *snapsvc.ConnectionError
	if errors.As(err, &ce) && ce.Err != nil && ce.Socket != "" {
		inner := ce.Err.Error()
		short := inner
		var ue *url.Error
		if errors.As(ce.Err, &ue) {
			// net/http's `Post "http://localhost/v2/apps": dial unix
			// SOCKET: connect: E`: the request and the socket again.
			short = strings.Replace(short, ue.Error(), netReason(ue.Err), 1)
		}
		short = strings.NewReplacer(
			"socket "+ce.Socket+" ", "the socket ", // "socket S does not exist"
			" at "+ce.Socket, " there", // "no socket at S and ..."
			ce.Socket+" ", "it ", // "S is a directory, not a socket"
		).Replace(short)
		s = strings.Replace(s, inner, short, 1)
	}
	return oneLine(dropMarkers(s))
}

// netReason is a dial's failure without its address: "connect: no such
// file or directory" for net's "dial unix /run/snapd.socket: connect: no
// such file or directory".
func netReason(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}
