package sqlbudget

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// Event kinds, Event.Kind.
const (
	EventWaiting        = "waiting"          // queued behind others (Wait)
	EventAcquired       = "acquired"         // a slot was taken (Waited, Max)
	EventUnbudgeted     = "unbudgeted"       // granted without the database: no cluster yet, or fail open
	EventFailed         = "failed"           // Acquire returned an error (Err)
	EventPaused         = "paused"           // a holder waits, holding its slot, while its key is paused
	EventFenced         = "fenced"           // a Fence confirmed the slot and recorded the act
	EventFenceFailed    = "fence-failed"     // a Fence could not confirm (Err)
	EventReady          = "ready"            // MarkReady recorded the services ready again
	EventLockDelayEnded = "lock-delay-ended" // HolderReady saw a vanished holder ready after it acted
	EventLost           = "lost"             // a held slot was lost (Err, Held)
	EventReleased       = "released"         // a slot was given back (Held)
	EventReleaseFailed  = "release-failed"   // a Release failed (Err); a retry tries again
	EventRecorded       = "recorded"         // a slot's act was appended to its key's history (Act)
	EventHalted         = "halted"           // a Record's failure halted its key (Act, Halt, Err: a *HaltedError)
)

// Event is a step of a Budget, for logs and metrics (the counterpart of
// etcdbudget.Controlled's events).
type Event struct {
	// Time is when it happened (local clock).
	Time time.Time
	// Kind is one of the Event* kinds.
	Kind string
	// Key is the budget key.
	Key string
	// Holder is this participant, or the vanished holder
	// ("lock-delay-ended").
	Holder string
	// Wait is what a waiter waits behind ("waiting").
	Wait budget.Wait
	// Waited is how long Acquire waited ("waiting", "acquired",
	// "unbudgeted", "failed").
	Waited time.Duration
	// Held is how long the slot has been held.
	Held time.Duration
	// Max is the key's slot count as resolved.
	Max int
	// Err is the failure, or the pause ("paused"), or the halt
	// ("halted").
	Err error
	// Act is the act recorded ("recorded", "halted").
	Act *budget.Act
	// Halt is the key's halt ("halted").
	Halt *budget.Halt
}

// Metrics is a snapshot of a Budget's counters and gauges, in the shape a
// Prometheus exporter wants (counters only grow; sums with their counts
// give means), as etcdbudget.Controlled's.
type Metrics struct {
	// Waiting is how many Acquires wait now; Holding how many slots are
	// held now.
	Waiting, Holding int
	// Acquired counts slots granted (Unbudgeted included); Unbudgeted
	// those granted without the database.
	Acquired, Unbudgeted uint64
	// Failed counts Acquires that returned an error.
	Failed uint64
	// Lost counts slots lost while held.
	Lost uint64
	// Released counts slots given back; ReleaseFailed failed Release
	// calls.
	Released, ReleaseFailed uint64
	// Fences counts confirmed fences.
	Fences uint64
	// Renewals counts the renewals of held slots' rows; RenewalsMissed
	// those not answered within TTL/3 of their start (the holder's margin
	// fell below two thirds of its TTL), failed ones included. A slot is
	// lost only when no renewal is answered within its TTL less ClockSkew.
	Renewals, RenewalsMissed uint64
	// PauseWaits counts holders that waited on a pause.
	PauseWaits uint64
	// DelayedTakeovers counts slots taken after waiting behind a vanished
	// holder's lock-delay.
	DelayedTakeovers uint64
	// Records counts acts this Budget's slots appended to the history;
	// Halts the halts their failures wrote.
	Records, Halts uint64
	// Transactions counts transaction attempts; TxFailures the failed
	// ones.
	Transactions, TxFailures uint64
	// WaitSeconds is the total time Acquires waited; HoldSeconds the
	// total time released or lost slots were held.
	WaitSeconds, HoldSeconds float64
}

// Metrics returns a snapshot of the counters.
func (b *Budget) Metrics() Metrics {
	b.mu.Lock()
	m := b.m
	b.mu.Unlock()
	m.Transactions, m.TxFailures = b.txs.Load(), b.txFailures.Load()
	return m
}

func (b *Budget) count(f func(*Metrics)) {
	b.mu.Lock()
	f(&b.m)
	b.mu.Unlock()
}

func (b *Budget) emit(ev Event) {
	if b.cfg.OnEvent == nil {
		return
	}
	ev.Time = time.Now()
	if ev.Holder == "" {
		ev.Holder = b.cfg.Holder
	}
	b.cfg.OnEvent(ev)
}

// Entry is one participant of a key, holding, waiting or vanished.
type Entry struct {
	// Holder identifies it ("node-1 pid 4242").
	Holder string `json:"holder"`
	// Since is when it queued; Granted when it took its slot; Acted its
	// last Fence; Ready its last MarkReady (database clock, for humans;
	// zero: never).
	Since   time.Time `json:"since"`
	Granted time.Time `json:"granted,omitzero"`
	Acted   time.Time `json:"acted,omitzero"`
	Ready   time.Time `json:"ready,omitzero"`
	// Renewed is the database's clock at its row's last renewal, and
	// Expires that plus the row's lease: when the row would expire if
	// every participant's clock ran with the database's. Both are for
	// humans: no participant decides by them. A row expires once a
	// participant has watched it unrenewed for its lease on its own
	// monotonic clock (Silent is how long this Budget has).
	Renewed time.Time `json:"renewed"`
	Expires time.Time `json:"expires"`
	// Silent is how long this Budget has seen the row go unrenewed, from
	// its first read of the row's current renewal (zero: renewed since
	// its last read, or never read before).
	Silent time.Duration `json:"silent,omitempty"`
	// Until is, for a vanished holder, when its lock-delay ends by this
	// Budget's judgement (local clock).
	Until time.Time `json:"until,omitzero"`
	// Max is the slot count it takes part with ("1", "25%").
	Max string `json:"max"`
	// BlockedByLockDelay: a waiter that would hold a slot but for a
	// vanished holder's lock-delay.
	BlockedByLockDelay bool `json:"blocked-by-lock-delay,omitempty"`
}

// PauseRecord is a key's pause.
type PauseRecord struct {
	// By is who paused the key; Since when (database clock); Reason the
	// operator's note. For a halt, By is the holder whose failure halted
	// the key and Reason says which act failed and why.
	By     string    `json:"by"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"`
	// Halt is set when the pause is a halt: the budget paused the key
	// itself after failed acts (Config.HaltAfter).
	Halt *budget.Halt `json:"halt,omitempty"`
}

// KeyStatus is what the database says about a key, read in one
// transaction, as this Budget judges it from what it has watched.
type KeyStatus struct {
	// Key is the canonical key; Max its slot count as this Budget
	// resolves it now.
	Key string `json:"key"`
	Max int    `json:"max"`
	// Holders hold a slot; Waiters wait, in the order they will be
	// served (BlockedByLockDelay tells those held back only by a
	// vanished holder); Vanished are holders this Budget judged expired
	// after a Fence without a MarkReady, holding their slot back until
	// Until. A Budget that has not watched the key for a TTL (a new
	// process: Status read once) counts every row as live: expiry is a
	// judgement of elapsed time, and it has seen none yet.
	Holders  []Entry `json:"holders"`
	Waiters  []Entry `json:"waiters"`
	Vanished []Entry `json:"vanished,omitempty"`
	// Paused is the key's pause, nil when not paused.
	Paused *PauseRecord `json:"paused,omitempty"`
	// Halt is the key's halt, nil when not halted: the key paused itself
	// after failed acts (Config.HaltAfter), and no holder acts on it
	// until an operator resumes it (Resume). Paused is then the halt's
	// pause.
	Halt *budget.Halt `json:"halt,omitempty"`
	// Now is the database's clock at the read (for humans).
	Now time.Time `json:"now"`
}

func entryOf(r row, silent time.Duration) Entry {
	e := Entry{Holder: r.holder, Since: msTime(r.since), Renewed: msTime(r.renewed), Expires: msTime(r.renewed + r.leaseMS),
		Silent: silent, Max: r.spec}
	if r.grantedAt.Valid {
		e.Granted = msTime(r.grantedAt.Int64)
	}
	if r.actedAt.Valid {
		e.Acted = msTime(r.actedAt.Int64)
	}
	if r.readyAt.Valid {
		e.Ready = msTime(r.readyAt.Int64)
	}
	return e
}

// Status reads key's holders, waiters, vanished holders and pause in one
// transaction, and judges them by what this Budget has watched of them
// (see KeyStatus).
func (b *Budget) Status(ctx context.Context, key string) (*KeyStatus, error) {
	key, err := normaliseKey(key)
	if err != nil {
		return nil, err
	}
	var st *KeyStatus
	var read beats
	err = b.tx(ctx, b.cfg.Unreachable, "reading the status of "+key, func(ctx context.Context, tx *sql.Tx) error {
		read = nil
		now, err := dbNow(ctx, tx)
		if err != nil {
			return err
		}
		rows, err := keyRows(ctx, tx, key, &read)
		if err != nil {
			return err
		}
		n, err := b.slots(ctx, tx)
		if err != nil {
			return err
		}
		st = &KeyStatus{Key: key, Max: n, Holders: []Entry{}, Waiters: []Entry{}, Now: msTime(now)}
		at := time.Now()
		spent := 0
		for _, r := range rows {
			if state, silent := b.judge(r, at); state == delayed && r.granted {
				e := entryOf(r, silent)
				e.Until = r.vanished(key, at, silent).Until
				st.Vanished = append(st.Vanished, e)
				spent++
			}
		}
		ahead := 0
		for _, r := range rows {
			state, silent := b.judge(r, at)
			switch {
			case state != alive:
			case r.granted:
				st.Holders = append(st.Holders, entryOf(r, silent))
				ahead++
			default:
				e := entryOf(r, silent)
				e.BlockedByLockDelay = ahead < n && ahead+spent >= n
				st.Waiters = append(st.Waiters, e)
				ahead++
			}
		}
		st.Paused, err = readPause(ctx, tx, key)
		if st.Paused != nil {
			st.Halt = st.Paused.Halt
		}
		return err
	})
	b.obs.record(read, time.Now())
	return st, err
}

func readPause(ctx context.Context, tx *sql.Tx, key string) (*PauseRecord, error) {
	var p PauseRecord
	var since int64
	var halt string
	err := tx.QueryRowContext(ctx, `SELECT by, since, reason, halt FROM snapsvc_budget_pauses WHERE key = ?`, key).Scan(&p.By, &since, &p.Reason, &halt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	p.Since = msTime(since)
	p.setHalt(key, halt)
	return &p, nil
}

// setHalt decodes a pause row's halt column (empty for an operator's pause).
// A halt that cannot be decoded still halts: its pause stands, with the
// row's reason.
func (p *PauseRecord) setHalt(key, raw string) {
	if raw == "" {
		return
	}
	var h budget.Halt
	if err := json.Unmarshal([]byte(raw), &h); err != nil {
		h = budget.Halt{Key: key, Holder: p.By, Reason: p.Reason, Since: p.Since}
	}
	p.Halt = &h
}

// pauseHolding returns the pause that holds key back, nil for none: the
// key's own, or else one of its parts' or their snaps'
// (budget.PauseScopes, in that order), as etcdbudget reads it. It is one
// query. A halt is a pause (PauseRecord.Halt set).
func pauseHolding(ctx context.Context, tx *sql.Tx, key string) (*PauseRecord, error) {
	scopes := budget.PauseScopes(key)
	args := make([]any, len(scopes))
	for i, sc := range scopes {
		args[i] = sc
	}
	rows, err := tx.QueryContext(ctx, `SELECT key, by, since, reason, halt FROM snapsvc_budget_pauses WHERE key IN (?`+strings.Repeat(", ?", len(scopes)-1)+`)`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	found := map[string]*PauseRecord{}
	for rows.Next() {
		var k, halt string
		var since int64
		var p PauseRecord
		if err := rows.Scan(&k, &p.By, &since, &p.Reason, &halt); err != nil {
			return nil, err
		}
		p.Since = msTime(since)
		p.setHalt(k, halt)
		found[k] = &p
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, sc := range scopes {
		if p := found[sc]; p != nil {
			return p, nil
		}
	}
	return nil, nil
}

// Pause pauses key cluster-wide: from now on every Fence of the key waits,
// holding its slot, until the key is resumed (so no holder acts), and
// every Acquire that takes a slot keeps it without returning; the
// machines behind stay queued in order. A restart already sent is not
// interrupted. Pausing a paused (or halted) key keeps the first record
// and returns it. The pause is appended to the key's history (a
// "paused" record: by this Budget's Holder, with reason).
func (b *Budget) Pause(ctx context.Context, key, reason string) (*PauseRecord, error) {
	key, err := normaliseKey(key)
	if err != nil {
		return nil, err
	}
	var p *PauseRecord
	token := newToken() // a retry after a lost answer finds its own pause
	err = b.tx(ctx, b.cfg.Unreachable, "pausing "+key, func(ctx context.Context, tx *sql.Tx) error {
		now, err := dbNow(ctx, tx)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO snapsvc_budget_pauses (key, by, since, reason, token) VALUES (?, ?, ?, ?, ?)`, key, b.cfg.Holder, now, reason, token)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 1 {
			failures, err := lastFailures(ctx, tx, key)
			if err != nil {
				return err
			}
			if _, err := b.appendRecord(ctx, tx, now, histRow{key: key, kind: string(budget.RecordPaused), token: "pause:" + token,
				by: b.cfg.Holder, reason: reason, failures: failures}); err != nil {
				return err
			}
		}
		p, err = readPause(ctx, tx, key)
		return err
	})
	return p, err
}

// Resume lifts key's pause, or its halt; the holders it held back act, in
// queue order. It reports whether the key was paused. It lifts the pause
// it finds and only that one: a retry after a commit whose answer was
// lost, or a Resume racing another operator's, leaves alone a pause (or
// a halt) set after the one it read (by someone else, meanwhile), and so
// a pause it read that a failure turned into a halt since (Record gives
// the halt a new token). The
// resume is appended to the key's history (a "resumed" record: by this
// Budget's Holder, its reason naming what it lifted), and the key's
// failures are counted afresh from it (Config.HaltAfter).
func (b *Budget) Resume(ctx context.Context, key string) (bool, error) {
	key, err := normaliseKey(key)
	if err != nil {
		return false, err
	}
	var lifts *string // the token of the pause this Resume lifts, once read
	var what string   // what it lifts, for the history
	token := newToken()
	err = b.tx(ctx, b.cfg.Unreachable, "resuming "+key, func(ctx context.Context, tx *sql.Tx) error {
		if lifts == nil {
			var p PauseRecord
			var ptoken, halt string
			err := tx.QueryRowContext(ctx, `SELECT token, by, reason, halt FROM snapsvc_budget_pauses WHERE key = ?`, key).Scan(&ptoken, &p.By, &p.Reason, &halt)
			if errors.Is(err, sql.ErrNoRows) {
				return nil // not paused
			}
			if err != nil {
				return err
			}
			p.setHalt(key, halt)
			lifts = &ptoken
			what = "lifted the pause by " + p.By
			if p.Halt != nil {
				what = "lifted the halt"
			}
			if p.Reason != "" {
				what += " (" + p.Reason + ")"
			}
		}
		now, err := dbNow(ctx, tx)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_pauses WHERE key = ? AND token = ?`, key, *lifts)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // lifted already (this Resume's answer was lost), or by someone else
		}
		_, err = b.appendRecord(ctx, tx, now, histRow{key: key, kind: string(budget.RecordResumed), token: "resume:" + token,
			by: b.cfg.Holder, reason: what})
		return err
	})
	return lifts != nil, err
}
