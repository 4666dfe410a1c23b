package sqlbudget

// The history and the halt (budget.Recorder, budget.Historian): every
// budgeted act, halt, pause and resume of a key is a row of
// snapsvc_budget_history (schema.go), appended in the transaction that
// does what it records. A key halts in the transaction that records the
// failure reaching Config.HaltAfter: a pause row carrying the halt, read
// by every Fence as any pause is, so the halt survives the process that
// wrote it and needs no process to enforce it.
//
// The count of failures since the key's last ready act or resume is
// carried by every record (its failures column) and read from the key's
// newest one, which retention never removes: the count is one indexed
// read, whatever the history's length, and neither HistoryLimit nor
// HistoryAge (the database's clock) can change it.

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

var (
	_ budget.Recorder  = (*slot)(nil)
	_ budget.Historian = (*Budget)(nil)
)

// histRow is one record to append.
type histRow struct {
	key, kind, token string
	act              *budget.Act
	halt             *budget.Halt
	by, reason       string
	failures         int
}

// lastFailures returns the key's failed acts since its last ready act or
// resume, as its newest record says (0 for a key without history).
func lastFailures(ctx context.Context, tx *sql.Tx, key string) (int, error) {
	var n int
	err := tx.QueryRowContext(ctx, `SELECT failures FROM snapsvc_budget_history WHERE key = ? ORDER BY id DESC LIMIT 1`, key).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return n, err
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.Format(time.RFC3339Nano)
}

func parseTimeText(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// appendRecord inserts r (once: a record whose token is there already is
// not appended again) and trims r's key to the budget's retention. It
// reports whether it appended.
func (b *Budget) appendRecord(ctx context.Context, tx *sql.Tx, now int64, r histRow) (bool, error) {
	var holder, machine, action, services, change, spawn, ready, outcome, haltJSON string
	var waited, held int64
	reason := r.reason
	if a := r.act; a != nil {
		holder, machine, action, change, outcome = a.Holder, a.Machine, a.Action, a.Change, string(a.Outcome)
		svc := a.Services
		if svc == nil {
			svc = []string{}
		}
		raw, err := json.Marshal(svc)
		if err != nil {
			return false, err
		}
		services, spawn, ready, reason = string(raw), timeText(a.Spawn), timeText(a.Ready), a.Reason
		waited, held = int64(a.Waited), int64(a.Held)
	}
	if r.halt != nil {
		raw, err := json.Marshal(r.halt)
		if err != nil {
			return false, err
		}
		haltJSON = string(raw)
		if holder == "" {
			holder, machine, change, reason = r.halt.Holder, r.halt.Machine, r.halt.Change, r.halt.Reason
		}
	}
	res, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO snapsvc_budget_history
		(key, kind, token, time, holder, machine, action, services, change_id, spawn, ready, outcome, reason, waited_ns, held_ns, by, halt, failures)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.key, r.kind, r.token, now, holder, machine, action, services, change, spawn, ready, outcome, reason, waited, held, r.by, haltJSON, r.failures)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil || n == 0 {
		return false, err
	}
	return true, b.trim(ctx, tx, r.key, now)
}

// trim removes key's records beyond HistoryLimit (the oldest) and, by
// HistoryAge, the oldest ones written before now less HistoryAge (by the
// database's clock), up to the first one that is not; never the key's
// newest record (it carries the count of failures). Both deletes go
// through the index (key, id) and read only what they remove, and one
// row more.
func (b *Budget) trim(ctx context.Context, tx *sql.Tx, key string, now int64) error {
	limit := max(b.cfg.HistoryLimit, 1)
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_history WHERE key = ? AND id <=
		(SELECT id FROM snapsvc_budget_history WHERE key = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`, key, key, limit); err != nil {
		return err
	}
	if b.cfg.HistoryAge < 0 {
		return nil
	}
	cutoff := now - b.cfg.HistoryAge.Milliseconds()
	_, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_history WHERE key = ? AND id < COALESCE(
		(SELECT id FROM snapsvc_budget_history WHERE key = ? AND time >= ? ORDER BY id LIMIT 1),
		(SELECT id FROM snapsvc_budget_history WHERE key = ? ORDER BY id DESC LIMIT 1))`, key, key, cutoff, key)
	return err
}

// actTokensKept is how many act tokens of a key snapsvc_budget_acts
// keeps (the newest): a Record of an ID is recognised as long as fewer
// than this many acts of its key were recorded after it, whatever
// HistoryLimit and HistoryAge removed from the history meanwhile.
const actTokensKept = 1024

// actToken is the token of the record of the act whose budget.Act.ID is
// id, of key: the same ID recorded again for the key (a Record retried by
// its caller, or a transaction retried after its commit's answer was
// lost) has the same token, and is recorded once; two acts with distinct
// IDs are two records, however alike their fields.
func actToken(key, id string) string {
	h := sha256.New()
	for _, f := range []string{key, id} {
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return "act:" + hex.EncodeToString(h.Sum(nil)[:16])
}

// actSeen reports whether the act whose token is token was recorded: its
// token is kept (snapsvc_budget_acts), or its record is.
func actSeen(ctx context.Context, tx *sql.Tx, token string) (bool, error) {
	var seen bool
	err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM snapsvc_budget_acts WHERE token = ?)
		OR EXISTS (SELECT 1 FROM snapsvc_budget_history WHERE token = ?)`, token, token).Scan(&seen)
	return seen, err
}

// keepActToken keeps token, an act of key just recorded, in
// snapsvc_budget_acts, which history retention does not touch, and
// removes the key's tokens beyond the newest actTokensKept (through the
// index (key, id), reading only what it removes and one row more).
func keepActToken(ctx context.Context, tx *sql.Tx, key, token string) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO snapsvc_budget_acts (key, token) VALUES (?, ?)`, key, token); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_acts WHERE key = ? AND id <=
		(SELECT id FROM snapsvc_budget_acts WHERE key = ? ORDER BY id DESC LIMIT 1 OFFSET ?)`, key, key, actTokensKept)
	return err
}

// haltKey halts key in tx after act, whose failure brought the key's
// failures to the threshold: it writes the halt on the key's pause row and
// appends the "halted" record, with token (chosen before the
// transaction). A key without a pause gets a pause row carrying the halt
// (by act's holder, with a reason naming the act). A key an operator
// paused is halted all the same: its pause row becomes the halt (by and
// reason kept, the halt set) and takes token, so that a Resume that read
// the pause, whose delete is conditional on the pause's token, lifts
// nothing. A key halted already is left as it is: haltKey reports whether
// it wrote the halt.
func (b *Budget) haltKey(ctx context.Context, tx *sql.Tx, now int64, key, token string, act *budget.Act, failures int) (bool, error) {
	var ptoken, phalt string
	err := tx.QueryRowContext(ctx, `SELECT token, halt FROM snapsvc_budget_pauses WHERE key = ?`, key).Scan(&ptoken, &phalt)
	paused := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, err
	}
	if paused && phalt != "" {
		return false, nil // halted already: the first halt stands
	}
	h := &budget.Halt{Key: key, Machine: act.Machine, Holder: act.Holder, Action: act.Action, Services: slices.Clone(act.Services),
		Change: act.Change, Reason: act.Reason, Failures: failures, Since: msTime(now)}
	if h.Services == nil {
		h.Services = []string{}
	}
	raw, err := json.Marshal(h)
	if err != nil {
		return false, err
	}
	if paused {
		_, err = tx.ExecContext(ctx, `UPDATE snapsvc_budget_pauses SET halt = ?, token = ? WHERE key = ? AND token = ?`,
			string(raw), token, key, ptoken)
	} else {
		_, err = tx.ExecContext(ctx, `INSERT INTO snapsvc_budget_pauses (key, by, since, reason, token, halt) VALUES (?, ?, ?, ?, ?, ?)`,
			key, act.Holder, now, haltReason(h, act.Action), token, string(raw))
	}
	if err != nil {
		return false, err
	}
	if _, err := b.appendRecord(ctx, tx, now, histRow{key: key, kind: string(budget.RecordHalted), token: "halt:" + token,
		halt: h, by: act.Holder, failures: failures}); err != nil {
		return false, err
	}
	return true, nil
}

// haltReason is the pause reason a halt writes: "halted: node-1's
// restart of k8s.kubelet (change 42): the change failed".
func haltReason(h *budget.Halt, action string) string {
	who := h.Machine
	if who == "" {
		who = h.Holder
	}
	if action == "" {
		action = "act"
	}
	s := fmt.Sprintf("halted: %s's %s of %s", who, action, strings.Join(h.Services, ", "))
	if h.Change != "" {
		s += fmt.Sprintf(" (change %s)", h.Change)
	}
	if h.Reason != "" {
		s += ": " + h.Reason
	}
	return s
}

// Record appends act to its key's history (budget.Recorder), in one
// transaction: it appends the act once per budget.Act.ID (an ID recorded
// for the key already, by any slot, appends and counts nothing: the
// key's newest actTokensKept act tokens are kept in snapsvc_budget_acts,
// which retention does not touch; an empty ID gets a random one, fixed
// across the transaction's retries, so a transaction retried after its
// commit's answer was lost finds its record, and a call of Record is one
// act), trims the key's history to Config.HistoryLimit and HistoryAge,
// and, when act failed and the key's failed acts since its last ready
// act or resume reach Config.HaltAfter, halts it unless it is halted
// already: a pause carrying the budget.Halt (by this holder, with a
// reason naming the machine, the services, the change and the failure)
// and a "halted" record. A key an operator paused is halted all the
// same: its pause becomes the halt (see haltKey), so a Resume that read
// the pause lifts nothing. From then on every Fence of the key waits,
// holding its slot, until an operator resumes it (Budget.Resume). It
// returns the key's halt when the key is halted after the write, nil
// otherwise. The slot need not be held: a holder records its act's
// outcome whether or not it still holds it.
func (s *slot) Record(ctx context.Context, act budget.Act) (*budget.Halt, error) {
	b := s.b
	act.Key = s.key
	if act.Holder == "" {
		act.Holder = b.cfg.Holder
	}
	if act.ID == "" {
		act.ID = newToken()
	}
	token := actToken(s.key, act.ID)
	haltToken := newToken()
	var (
		halt     *budget.Halt
		recorded bool
		halted   bool
		appended bool // an attempt of this call appended the act
	)
	err := b.tx(ctx, b.cfg.Unreachable, "recording an act of "+s.key, func(ctx context.Context, tx *sql.Tx) error {
		halt, recorded, halted = nil, false, false
		now, err := dbNow(ctx, tx)
		if err != nil {
			return err
		}
		seen, err := actSeen(ctx, tx, token)
		if err != nil {
			return err
		}
		if seen {
			// Recorded already: by an earlier attempt of this call whose
			// commit's answer was lost (did that commit write the
			// halt?), or by an earlier call with this ID.
			recorded = appended
			if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM snapsvc_budget_pauses WHERE key = ? AND token = ?)
				OR EXISTS (SELECT 1 FROM snapsvc_budget_history WHERE token = ?)`, s.key, haltToken, "halt:"+haltToken).Scan(&halted); err != nil {
				return err
			}
		} else {
			prev, err := lastFailures(ctx, tx, s.key)
			if err != nil {
				return err
			}
			failures, halts := budget.FailuresAfter(prev, act, b.cfg.HaltAfter)
			if _, err := b.appendRecord(ctx, tx, now, histRow{key: s.key, kind: string(budget.RecordAct), token: token, act: &act, failures: failures}); err != nil {
				return err
			}
			if err := keepActToken(ctx, tx, s.key, token); err != nil {
				return err
			}
			recorded, appended = true, true
			if halts {
				if halted, err = b.haltKey(ctx, tx, now, s.key, haltToken, &act, failures); err != nil {
					return err
				}
			}
		}
		p, err := pauseHolding(ctx, tx, s.key)
		if err != nil {
			return err
		}
		if p != nil {
			halt = p.Halt
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sqlbudget: recording the act of %s: %w", s.key, err)
	}
	if recorded {
		b.count(func(m *Metrics) { m.Records++ })
		a := act
		b.emit(Event{Kind: EventRecorded, Key: s.key, Act: &a, Held: time.Since(s.since)})
	}
	if halted && halt != nil {
		b.count(func(m *Metrics) { m.Halts++ })
		b.cfg.Logger.Warn("key halted: no holder acts on it until an operator resumes it", "key", s.key, "reason", halt.Reason, "machine", halt.Machine, "change", halt.Change)
		a := act
		b.emit(Event{Kind: EventHalted, Key: s.key, Act: &a, Halt: halt,
			Err: &HaltedError{Halt: *halt}})
	}
	return halt, nil
}

// History returns key's last limit records, oldest first (all that are
// kept when limit <= 0), read in one transaction through the index
// (key, id) (budget.Historian).
func (b *Budget) History(ctx context.Context, key string, limit int) ([]budget.Record, error) {
	key, err := normaliseKey(key)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	var out []budget.Record
	err = b.tx(ctx, b.cfg.Unreachable, "reading the history of "+key, func(ctx context.Context, tx *sql.Tx) error {
		out = nil
		rows, err := tx.QueryContext(ctx, `SELECT id, kind, time, holder, machine, action, services, change_id, spawn, ready, outcome, reason, waited_ns, held_ns, by, halt
			FROM snapsvc_budget_history WHERE key = ? ORDER BY id DESC LIMIT ?`, key, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				r                                                                              budget.Record
				at, waited, held                                                               int64
				kind, holder, machine, action, services, change, spawn, ready, outcome, reason string
				by, haltJSON                                                                   string
			)
			if err := rows.Scan(&r.Seq, &kind, &at, &holder, &machine, &action, &services, &change, &spawn, &ready, &outcome, &reason, &waited, &held, &by, &haltJSON); err != nil {
				return err
			}
			r.Time, r.Kind = msTime(at), budget.RecordKind(kind)
			switch r.Kind {
			case budget.RecordAct:
				a := &budget.Act{Key: key, Holder: holder, Machine: machine, Action: action, Change: change,
					Outcome: budget.Outcome(outcome), Reason: reason, Waited: time.Duration(waited), Held: time.Duration(held)}
				if services != "" {
					if err := json.Unmarshal([]byte(services), &a.Services); err != nil {
						return final(fmt.Errorf("%w: sqlbudget: history record %d of %s: services %q: %w", budget.ErrRefused, r.Seq, key, services, err))
					}
				}
				if a.Spawn, err = parseTimeText(spawn); err == nil {
					a.Ready, err = parseTimeText(ready)
				}
				if err != nil {
					return final(fmt.Errorf("%w: sqlbudget: history record %d of %s: %w", budget.ErrRefused, r.Seq, key, err))
				}
				r.Act = a
			default: // halted, paused, resumed
				r.By, r.Reason = by, reason
			}
			if haltJSON != "" {
				var h budget.Halt
				if err := json.Unmarshal([]byte(haltJSON), &h); err != nil {
					return final(fmt.Errorf("%w: sqlbudget: history record %d of %s: halt %q: %w", budget.ErrRefused, r.Seq, key, haltJSON, err))
				}
				r.Halt = &h
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	slices.Reverse(out)
	if out == nil {
		out = []budget.Record{}
	}
	return out, nil
}

// Keys lists the budget's keys that have anything in the database: holders
// or waiters (live or not), a pause or a halt, a history; sorted, each
// once, read in one transaction.
func (b *Budget) Keys(ctx context.Context) ([]string, error) {
	var keys []string
	err := b.tx(ctx, b.cfg.Unreachable, "listing the keys", func(ctx context.Context, tx *sql.Tx) error {
		keys = nil
		rows, err := tx.QueryContext(ctx, `SELECT key FROM snapsvc_budget_slots UNION SELECT key FROM snapsvc_budget_pauses
			UNION SELECT key FROM snapsvc_budget_history ORDER BY key`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return err
			}
			keys = append(keys, k)
		}
		return rows.Err()
	})
	if keys == nil {
		keys = []string{}
	}
	return keys, err
}

// HaltedError is a holder held back by a halt (a pause the budget set
// itself after failed acts, Config.HaltAfter) until its context ended:
// nothing was sent. It wraps budget.ErrPaused, budget.ErrHalted and why
// the wait ended. Retrying cannot help until an operator resumes the key.
type HaltedError struct {
	// Key is the key held back (the halt may be one of its scopes').
	Key string
	// Halt is the halt: the machine, services, change and reason of the
	// failure that halted the key.
	Halt budget.Halt
	// Cause is why the wait ended (the context's cause), nil for none.
	Cause error
}

func (e *HaltedError) Error() string {
	h := e.Halt
	who := h.Machine
	if who == "" {
		who = h.Holder
	}
	key := e.Key
	if key == "" {
		key = h.Key
	}
	what := key + " is halted"
	if key != h.Key {
		what = key + " is held back by the halt of " + h.Key
	}
	s := fmt.Sprintf("%v: %v: sqlbudget: %s since %s after %d failed act(s): %s's act on %s",
		budget.ErrPaused, budget.ErrHalted, what, h.Since.Format(time.RFC3339), h.Failures, who, strings.Join(h.Services, ", "))
	if h.Change != "" {
		s += " (change " + h.Change + ")"
	}
	if h.Reason != "" {
		s += " failed: " + h.Reason
	} else {
		s += " failed"
	}
	s += fmt.Sprintf("; nothing was sent: once the cause is fixed, an operator lifts the halt with Budget.Resume(%q) (snapsvc-rollout resume %s)", h.Key, h.Key)
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap returns budget.ErrPaused, budget.ErrHalted and the cause.
func (e *HaltedError) Unwrap() []error {
	errs := []error{budget.ErrPaused, budget.ErrHalted}
	if e.Cause != nil {
		errs = append(errs, e.Cause)
	}
	return errs
}

// Retryable reports false: only an operator's resume helps.
func (e *HaltedError) Retryable() bool { return false }

// pausedError is why a holder waiting on p (its key's pause, or a scope's)
// stopped when ctx ended: a *HaltedError for a halt.
func pausedError(key string, p *PauseRecord, cause error) error {
	if p != nil && p.Halt != nil {
		return &HaltedError{Key: key, Halt: *p.Halt, Cause: cause}
	}
	return fmt.Errorf("%w: sqlbudget: %s stayed paused while holding its slot: %w", budget.ErrPaused, key, cause)
}
