package main

// The JSON documents' durations are numbers of seconds in fields named
// *_seconds ("held_seconds": 1.5), and their times RFC 3339 strings, in
// every command: what kubectl and etcdctl -w json give is numbers and
// RFC 3339 times, never Go's duration strings ("1.5s") nor the bare
// nanoseconds a budget.Act is stored with in etcd (its history records
// keep that form, which other versions read).

import (
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// actDoc is a budget.Act as the commands print it: waited_seconds and
// held_seconds in place of the stored waited and held nanoseconds.
type actDoc struct {
	budget.Act
	// Waited and Held hide the Act's fields of the same JSON names
	// (encoding/json: the shallower field wins), and are never printed.
	Waited        struct{} `json:"waited,omitzero"`
	Held          struct{} `json:"held,omitzero"`
	WaitedSeconds float64  `json:"waited_seconds"`
	HeldSeconds   float64  `json:"held_seconds"`
}

// newActDoc is a's document, nil for nil.
func newActDoc(a *budget.Act) *actDoc {
	if a == nil {
		return nil
	}
	return &actDoc{Act: *a, WaitedSeconds: seconds(a.Waited), HeldSeconds: seconds(a.Held)}
}

// recordDoc is a budget.Record as history -w json prints it: its act as
// an actDoc.
type recordDoc struct {
	budget.Record
	Act *actDoc `json:"act,omitempty"` // hides Record.Act
}

// recordDocs are recs' documents.
func recordDocs(recs []budget.Record) []recordDoc {
	out := make([]recordDoc, len(recs))
	for i, r := range recs {
		out[i] = recordDoc{Record: r, Act: newActDoc(r.Act)}
	}
	return out
}

// seconds is d in seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }
