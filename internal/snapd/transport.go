package snapd

import "net/http"

// WrapTransport replaces the client's transport (the one dialling the
// Unix socket) by wrap(transport), for instance otelhttp.NewTransport.
// Call it before the first request.
func (c *Client) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	if wrap != nil {
		c.http.Transport = wrap(c.http.Transport)
	}
}
