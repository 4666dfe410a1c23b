package fake

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// WithStateFile makes the fake rewrite a state file (Server.StateFile, in
// the socket directory) whenever its state changes, as snapd rewrites
// /var/lib/snapd/state.json: atomically (a temporary file renamed over
// it, osutil.AtomicWriteFile) each time the state lock is released after
// a change, before any request can see the new state
// (overlord/state/state.go Unlock -> checkpoint). Clients can watch it to
// learn that something changed without asking snapd. The content is the
// fake's own (a summary of the changes), not snapd's state format.
func WithStateFile() Option { return func(c *config) { c.stateFile = true } }

// StateFile returns the path of the state file WithStateFile keeps, or "".
func (s *Server) StateFile() string {
	if !s.cfg.stateFile {
		return ""
	}
	return filepath.Join(s.dir, "state.json")
}

// stateChangedLocked notes that the state must be written out.
func (s *Server) stateChangedLocked() {
	if s.cfg.stateFile {
		s.stateDirty = true
	}
}

// checkpointLocked writes the state file if the state changed since the
// last write.
func (s *Server) checkpointLocked() {
	if !s.stateDirty || s.closed {
		return
	}
	s.stateDirty = false
	type changeSummary struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	out := struct {
		LastChangeID int             `json:"last-change-id"`
		Changes      []changeSummary `json:"changes"`
	}{LastChangeID: s.lastChangeID}
	for _, c := range s.changes {
		out.Changes = append(out.Changes, changeSummary{c.id, c.status()})
	}
	data, _ := json.Marshal(out)
	path := s.StateFile()
	tmp, err := os.CreateTemp(s.dir, "state.json.*~")
	if err != nil {
		return
	}
	_, werr := tmp.Write(data)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
}
