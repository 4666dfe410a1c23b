package budget

import (
	"context"
	"errors"
	"time"
)

// A budget that keeps a history also halts: after HaltAfter failed acts
// of a key (counted since the key's last successful act or resume), the
// key halts itself, in the same write that records the last failure, so
// that a bad restart never walks the fleet one machine at a time. A halted
// key is paused with a reason (the Halt): no holder's Fence lets it act
// until an operator resumes the key, and the halt survives the process
// that halted it. Backends implement it with Recorder (the holder's side)
// and Historian (the operator's side).

// Outcome is how a budgeted act ended, as its holder judged it from
// snapd's records and the services' readiness checks.
type Outcome string

const (
	// OutcomeReady: the change was Done and the services passed their
	// readiness checks. It ends a run of failures.
	OutcomeReady Outcome = "ready"
	// OutcomeFailed: the change failed (Error, Undone, Hold), the services
	// did not pass their checks within their bound, or the hold reached
	// its MaxHold without snapd's records showing the change's end. It
	// counts toward the key's halt.
	OutcomeFailed Outcome = "failed"
	// OutcomeAbandoned: the holder let go without an outcome (its Client
	// closed while the change ran or before the services were ready). It
	// neither counts toward a halt nor ends a run of failures.
	OutcomeAbandoned Outcome = "abandoned"
)

// Act is one budgeted act as its holder records it: what it did, under
// which slot, what snapd recorded of the change, and how it ended.
type Act struct {
	// ID identifies the act (random, unique per act and key): a Record of
	// an ID already recorded for its key appends nothing and counts
	// nothing again, however long ago it was written (a retry after a
	// lost answer, or snapsvc retrying a record that failed). Empty: the
	// backend makes one per Record call.
	ID string `json:"id,omitempty"`
	// Key is the budget key; Holder the slot's holder ("node-1 pid 42").
	Key    string `json:"key"`
	Holder string `json:"holder"`
	// Machine is the holder's host name.
	Machine string `json:"machine,omitempty"`
	// Action is "restart", "stop", "start" or "refresh"; Services the
	// services it named ("k8s.kubelet"; a refresh names its snap, "k8s").
	Action   string   `json:"action"`
	Services []string `json:"services"`
	// Change is snapd's change id ("" when none is known: snapctl mode,
	// or snapd made none).
	Change string `json:"change,omitempty"`
	// Spawn and Ready are the change's spawn and ready times as snapd
	// recorded them (zero: unknown).
	Spawn time.Time `json:"spawn,omitzero"`
	Ready time.Time `json:"ready,omitzero"`
	// Outcome is how it ended; Reason says why, for a failure.
	Outcome Outcome `json:"outcome"`
	Reason  string  `json:"reason,omitempty"`
	// Waited is how long the holder waited for its slot; Held how long it
	// held it until this record.
	Waited time.Duration `json:"waited"`
	Held   time.Duration `json:"held"`
}

// Failed reports whether a counts toward a halt.
func (a Act) Failed() bool { return a.Outcome == OutcomeFailed }

// Recorder is implemented by slots whose budget keeps a history and halts
// keys. snapsvc calls Record once per hold whose request to act was
// written, when the hold's outcome is final (before the slot is released
// or abandoned; a lost slot records nothing: its backend's lease says what
// happened).
type Recorder interface {
	// Record appends act to its key's history. When act failed and the
	// key's failures since its last successful act or resume reach the
	// budget's halt threshold, the same write halts the key (a pause with
	// the Halt), unless it is halted already; a key an operator paused
	// meanwhile is halted all the same (its pause becomes the halt, so a
	// resume that read the pause lifts nothing). It returns the key's
	// halt when the key is halted after the write (nil otherwise). Record
	// must be safe to repeat: a retry of an act (its ID) records it once.
	// The slot need not be held any more (a slot lost while its change
	// ran still records the act).
	Record(ctx context.Context, act Act) (*Halt, error)
}

// Halt is why a key halted: the act whose failure reached the threshold.
type Halt struct {
	// Key is the halted key.
	Key string `json:"key"`
	// Machine, Holder, Action, Services and Change are the failed act's
	// (Action is empty in a halt written before it was recorded: a
	// restart).
	Machine  string   `json:"machine,omitempty"`
	Action   string   `json:"action,omitempty"`
	Holder   string   `json:"holder"`
	Services []string `json:"services"`
	Change   string   `json:"change,omitempty"`
	// Reason is the failed act's reason.
	Reason string `json:"reason"`
	// Failures is how many failed acts the halt counted (the threshold).
	Failures int `json:"failures"`
	// Since is when the halt was written (the store's clock where it has
	// one, else the halting holder's; for humans).
	Since time.Time `json:"since"`
}

// RecordKind is what a history record records.
type RecordKind string

const (
	// RecordAct: a budgeted act (Act).
	RecordAct RecordKind = "act"
	// RecordHalted: the key halted itself (Halt).
	RecordHalted RecordKind = "halted"
	// RecordPaused and RecordResumed: an operator paused or resumed the
	// key (By, Reason).
	RecordPaused  RecordKind = "paused"
	RecordResumed RecordKind = "resumed"
)

// Record is one entry of a key's history, oldest first in History's
// answer.
type Record struct {
	// Seq orders a key's records (it grows; gaps are records retention
	// removed).
	Seq int64 `json:"seq"`
	// Time is when it was written (the store's clock where it has one,
	// else the writer's; for humans).
	Time time.Time `json:"time"`
	// Kind says which of the fields below are set.
	Kind RecordKind `json:"kind"`
	// Act is a RecordAct's act.
	Act *Act `json:"act,omitempty"`
	// Halt is a RecordHalted's halt.
	Halt *Halt `json:"halt,omitempty"`
	// By and Reason are a pause's or resume's operator and reason.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Historian is implemented by budgets that keep a history: the library
// call behind `snapsvc-rollout history`.
type Historian interface {
	// History returns key's last limit records (all that are kept when
	// limit <= 0), oldest first.
	History(ctx context.Context, key string, limit int) ([]Record, error)
}

// ErrHalted: the key halted itself after failed acts, and an operator has
// not resumed it. Errors wrapping it wrap ErrPaused too (a halt is a pause
// the budget set itself): nothing was sent. Retrying cannot help until an
// operator resumes the key.
var ErrHalted = errors.New("restart budget halted")

// Defaults of a budget's history and halt, for every backend.
const (
	// DefaultHaltAfter is the halt threshold of a budget that does not
	// set one: the first failed act halts its key.
	DefaultHaltAfter = 1
	// DefaultHistoryLimit is how many records a key's history keeps.
	DefaultHistoryLimit = 1000
	// DefaultHistoryAge is how long a record is kept, by its own time
	// (housekeeping only: no safety decision reads it).
	DefaultHistoryAge = 30 * 24 * time.Hour
)

// FailuresAfter is the rule every backend counts failed acts by, said
// here once: given the key's count before act (its failed acts since its
// last ready act or resume; a resume sets it to 0), it returns the count
// after act (a ready act ends the run, an abandoned one leaves it) and
// whether act halts the key: act failed and the count reached haltAfter
// (> 0; a negative threshold never halts). A key halted already is the
// backend's to tell (it halts once).
func FailuresAfter(before int, act Act, haltAfter int) (after int, halts bool) {
	switch act.Outcome {
	case OutcomeReady:
		return 0, false
	case OutcomeFailed:
		after = before + 1
		return after, haltAfter > 0 && after >= haltAfter
	}
	return before, false
}
