package fake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// FaultKind says what an injected fault does to the requests it matches.
type FaultKind int

const (
	// FaultDrop handles the request fully (a POST makes its change) and
	// then closes the connection without an answer.
	FaultDrop FaultKind = iota + 1
	// FaultCut handles the request, then sends the status line, headers
	// (with the full Content-Length) and the first half of the body, and
	// closes the connection: the client reads a body cut short.
	FaultCut
	// FaultGarble handles the request and answers with the status snapd
	// would have sent but a body that is not a snapd envelope (a proxy's
	// error page, say).
	FaultGarble
	// FaultReject closes the connection once the request has been read,
	// without acting on it. To the client it looks exactly like FaultDrop:
	// it cannot know whether snapd acted.
	FaultReject
	// FaultReply does not act on the request; it answers Status and Body
	// as given (for example snapd's 500 "request canceled", or an empty
	// notices list returned at once instead of long-polling).
	FaultReply
	// FaultLate closes the connection at once, without an answer, and
	// acts on the request later: when Hold is closed (at once without
	// one). snapd carries on with a request whose client went away, and
	// its handler may get to it late (waiting for the state lock, say), so
	// a client that looks for the request's change too soon finds none.
	FaultLate
	// FaultWedge is a wedged snapd (its state lock held by a stuck task):
	// it accepts the connection and reads the request, then does nothing
	// until Hold is closed (for good, until the server closes or stops,
	// when Hold is nil). Then it handles the request as snapd would once
	// it got the lock, and answers it normally — or, if the client went
	// away meanwhile, still acts on it (snapd carries on with a request
	// whose client left) and answers nobody.
	FaultWedge
)

func (k FaultKind) String() string {
	switch k {
	case 0:
		return "hold"
	case FaultDrop:
		return "drop"
	case FaultCut:
		return "cut"
	case FaultGarble:
		return "garble"
	case FaultReject:
		return "reject"
	case FaultReply:
		return "reply"
	case FaultLate:
		return "late"
	case FaultWedge:
		return "wedge"
	}
	return fmt.Sprintf("FaultKind(%d)", int(k))
}

// handles reports whether the request is acted on before the fault
// applies.
func (k FaultKind) handles() bool {
	return k == 0 || k == FaultDrop || k == FaultCut || k == FaultGarble
}

// Fault describes a fault to inject into the answers of matching requests.
// A request matches when every non-empty selector matches.
type Fault struct {
	// Kind is what happens to a matching request.
	Kind FaultKind
	// Method matches the HTTP method ("" for any).
	Method string
	// Path matches the URL path exactly, or as a prefix when it ends in
	// "/" (e.g. "/v2/changes/" for every change id); "" for any.
	Path string
	// Socket is "main", "snap" or "" for both.
	Socket string
	// Match, when set, must also accept the request (its Time, Socket,
	// Method, Path, Query and Body are filled in). It is called with the
	// server's lock held: it must not call the Server.
	Match func(Request) bool
	// Times is how many matching requests the fault affects; 0 means
	// every one until the fault is removed.
	Times int
	// Status and Body are FaultReply's answer. ErrorBody and SyncBody
	// build snapd envelopes.
	Status int
	Body   []byte
	// Hold, when set, holds the answer until the channel is closed (or
	// the client goes away): a request the fault lets be handled (no Kind,
	// FaultDrop, FaultCut, FaultGarble) is acted on first and its answer
	// held, so snapd has acted while the client still waits; FaultReject
	// and FaultReply wait before doing anything; FaultLate closes the
	// connection at once and acts when Hold is closed; FaultWedge waits
	// before doing anything, then acts and answers. A Fault with Hold and
	// no Kind only delays the answer.
	Hold <-chan struct{}
}

// InjectedFault is a fault in force; Remove ends it.
type InjectedFault struct {
	s    *Server
	f    Fault
	hits int
	gone bool
}

// InjectFault adds a fault. Faults are tried in the order they were
// injected; the first that matches a request applies to it.
func (s *Server) InjectFault(f Fault) *InjectedFault {
	if f.Kind < 0 || f.Kind > FaultWedge || (f.Kind == 0 && f.Hold == nil) {
		panic(fmt.Sprintf("fake snapd: InjectFault: unknown kind %v", f.Kind))
	}
	if f.Kind == FaultReply && f.Status == 0 {
		f.Status = http.StatusOK
	}
	inj := &InjectedFault{s: s, f: f}
	s.mu.Lock()
	s.faults = append(s.faults, inj)
	s.mu.Unlock()
	return inj
}

// Remove ends the fault; requests already affected stay affected.
func (f *InjectedFault) Remove() {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	f.removeLocked()
}

func (f *InjectedFault) removeLocked() {
	f.gone = true
	for i, g := range f.s.faults {
		if g == f {
			f.s.faults = append(f.s.faults[:i], f.s.faults[i+1:]...)
			return
		}
	}
}

// Hits returns how many requests the fault has affected.
func (f *InjectedFault) Hits() int {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	return f.hits
}

// ClearFaults removes every injected fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.faults {
		f.gone = true
	}
	s.faults = nil
}

// faultForLocked returns the fault that applies to req, counting the hit.
func (s *Server) faultForLocked(req Request) *Fault {
	for _, inj := range s.faults {
		f := &inj.f
		if f.Method != "" && f.Method != req.Method {
			continue
		}
		if f.Socket != "" && f.Socket != req.Socket {
			continue
		}
		if f.Path != "" {
			if strings.HasSuffix(f.Path, "/") {
				if !strings.HasPrefix(req.Path, f.Path) {
					continue
				}
			} else if f.Path != req.Path {
				continue
			}
		}
		if f.Match != nil && !f.Match(req) {
			continue
		}
		inj.hits++
		if f.Times > 0 && inj.hits >= f.Times {
			inj.removeLocked()
		}
		cp := *f
		return &cp
	}
	return nil
}

// ErrorBody returns a snapd error envelope, as daemon/response.go writes
// it: {"type":"error","status-code":status,"status":...,"result":{"message":...,"kind":...}}.
func ErrorBody(status int, kind, message string) []byte {
	b, _ := json.Marshal(respJSON{Type: "error", StatusCode: status, Status: http.StatusText(status), Result: &errorResult{Message: message, Kind: kind}})
	return b
}

// SyncBody returns a snapd sync envelope with result.
func SyncBody(result any) []byte {
	b, err := json.Marshal(respJSON{Type: "sync", StatusCode: http.StatusOK, Status: "OK", Result: result})
	if err != nil {
		panic(fmt.Sprintf("fake snapd: SyncBody: %v", err))
	}
	return b
}

// garbled is what FaultGarble answers instead of an envelope.
const garbled = "<html><body>502 Bad Gateway</body></html>\n"

// RequestsTo returns, inside WaitFor, how many requests to route
// ("METHOD /path" with ids as {id}, as in Counters) have arrived so far.
// A request counts as it arrives, before snapd acts on it: one that is
// long-polling, wedged or waiting for its turn counts at once. To know
// that snapd has acted on a request (its answer made, even if a fault
// holds or drops it), use Handled.
func (v View) RequestsTo(route string) int { return v.s.counters.Requests[route] }

// Handled returns, inside WaitFor, how many requests to route have been
// handled: acted on, or refused by a fault, and entered in the request
// log (Server.Requests), whether or not their answer has reached the
// client yet (a Fault's Hold may still hold it). A condition such as "the
// client's listing was made before this change was added" needs Handled,
// not RequestsTo.
func (v View) Handled(route string) int { return v.s.handled[route] }
