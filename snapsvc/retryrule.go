package snapsvc

import "github.com/snapsvc/snapsvc/retry"

// The retry rule: what snapsvc does after a request to snapd failed,
// decided in one place for every request, read or act (as net/http's
// Transport decides in one function what it may send again). Package retry
// classifies the failure; nextStep turns the class and what the request
// does into the step. How long to pause is the call's (call.pause), and
// whether a call may still take the step is its bounds' (call.exhausted):
// this rule never ends a call for lack of time.
//
//	class          read (asking twice changes nothing)   act (start, stop, restart, abort)
//	Transient      ask again                             ask again
//	Indeterminate  ask again                             look the change up; never send blindly
//	Conflict       give up (a read never conflicts)      wait the blocker out, then act again
//	Permanent      give up                               give up
//
// Transient is snapd unreachable or restarting, or a garbled answer to a
// read; Indeterminate is a request whose answer was lost after it was
// written (a snapctl listing, a POST, can be a read); Conflict is snapd's
// change conflict in every form it sends; Permanent is everything that
// stays true (an unknown service, a refusal, bad input).

// requestKind says what a request does to snapd.
type requestKind int

const (
	// reading: the request changes nothing, so it may be sent again.
	reading requestKind = iota
	// acting: the request may change snapd's state; sent twice it could
	// act twice.
	acting
)

// step is what a failed request calls for.
type step int

const (
	giveUp   step = iota // return the failure: retrying cannot help
	askAgain             // pause (call.pause), then send the request again
	waitOut              // wait for the blocking change, then act again
	lookUp               // find out whether the request made a change first
)

// nextStep is the retry rule (see above).
func nextStep(kind requestKind, err error) step {
	switch retry.Classify(err) {
	case retry.Transient:
		return askAgain
	case retry.Indeterminate:
		if kind == reading {
			return askAgain
		}
		return lookUp
	case retry.Conflict:
		if kind == acting {
			return waitOut
		}
	}
	return giveUp
}
