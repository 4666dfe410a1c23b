package fake

// WithPeerUID makes the fake take every caller for uid, whatever the
// socket's peer credentials say: the access rules' tests run the same as
// root and as a user.
func WithPeerUID(uid int) Option { return func(c *config) { c.peerUID = &uid } }
