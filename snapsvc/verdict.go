package snapsvc

import "github.com/snapsvc/snapsvc/internal/snapd"

// ChangeFailed reports whether the change became ready without doing its
// work: status Error, Undone or Hold. Its outcome is known — the action
// did not happen and nothing of it still runs — so a caller's retry loop
// may make a new change (retry.Do does: a start of kube-apiserver that
// failed because etcd was not up yet may well succeed a moment later). A
// change that is gone or still waiting is not failed: its outcome is not
// known.
func (e *ChangeError) ChangeFailed() bool {
	switch e.Status {
	case snapd.StatusError, snapd.StatusUndone, snapd.StatusHold:
		return true
	}
	return false
}
