package snapservices

import (
	"context"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// WithIntents makes every start, stop and restart of the Snap durable
// across the death of its process (snapsvc.WithIntents): the intent is
// recorded in the snap's lock directory ($SNAP_COMMON/.snapsvc-lock)
// before anything is sent, and a Snap built after a crash, an OOM kill, a
// refresh that restarted the daemon or a reboot finishes what was left,
// once on the machine, judged from snapd's records. Build the Snap once
// when the daemon starts; Replayed says what that did. It has no effect
// with WithCommandRunner or WithCommandOutput (no client of ours runs the
// commands).
func WithIntents() Option { return WithClientOptions(snapsvc.WithIntents()) }

// Replayed waits, within ctx, for the replay of unfinished intents that
// building the Snap began (WithIntents), and returns what it did.
func (s *Snap) Replayed(ctx context.Context) ([]snapsvc.Replayed, error) {
	if s.client == nil {
		return nil, nil
	}
	return s.client.Startup(ctx)
}
