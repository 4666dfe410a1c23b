package snapsvc

import "net/http"

// WithTransport wraps the HTTP transport every request to snapd goes
// through: wrap gets the transport that dials snapd's Unix socket (and,
// in snapctl mode, the one of the snap socket) and returns the one to use,
// e.g. otelhttp.NewTransport for tracing, or a RoundTripper that counts or
// logs requests. Requests keep their http://localhost/v2/... URLs; wrap
// must pass them on to the transport it was given.
func WithTransport(wrap func(http.RoundTripper) http.RoundTripper) Option {
	return func(s *settings) { s.transport = wrap }
}

// wrapTransports applies WithTransport to the client's wire clients.
func (s *settings) wrapTransports(c *Client) {
	if s.transport == nil {
		return
	}
	c.main.WrapTransport(s.transport)
	if c.ctl != nil && c.ctl != c.main {
		c.ctl.WrapTransport(s.transport)
	}
}
