package snapd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Log is one journal entry of a service, as GET /v2/logs sends it
// (snapd's client.Log, client/apps.go).
type Log struct {
	// Timestamp is the entry's time, to the microsecond, in UTC.
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	// SID is the syslog identifier (the unit's "snap.NAME.APP", or
	// "systemd" for systemd's own lines), PID the sender's process id.
	SID string `json:"sid"`
	PID string `json:"pid"`
}

// String is the entry as snap logs prints it (client.Log.String): the
// time in RFC 3339 in loc, then "SID[PID]: MESSAGE".
func (l Log) String(loc *time.Location) string {
	return fmt.Sprintf("%s %s[%s]: %s", l.Timestamp.In(loc).Format(time.RFC3339), l.SID, l.PID, l.Message)
}

// LogsOptions selects the entries of Logs.
type LogsOptions struct {
	// Names are services or snaps (every service of the snap).
	Names []string
	// N is how many of the latest entries to send; negative for all.
	// snap logs sends 10 by default; snapd 2.73 and later refuse 0.
	N int
	// Follow keeps the answer open, sending new entries as they come.
	Follow bool
}

// Logs reads the services' journal, as snap logs does: GET /v2/logs
// (main socket only), whose answer is not an envelope but an
// application/json-seq stream, "\x1e{...}\n" per entry (RFC 7464;
// daemon/response.go journalLineReaderSeqResponse). It calls each for
// every entry, in order, until the stream ends, each returns an error
// (returned as is), or ctx ends (Follow: the way to stop). Records that
// are empty, lack the record separator or are not JSON are skipped, as
// snap's client skips them. A refusal is snapd's envelope (*Error).
func (c *Client) Logs(ctx context.Context, opts LogsOptions, each func(Log) error) error {
	const path = "/v2/logs"
	q := url.Values{}
	if len(opts.Names) > 0 {
		q.Set("names", strings.Join(opts.Names, ","))
	}
	q.Set("n", strconv.Itoa(opts.N))
	if opts.Follow {
		q.Set("follow", "true")
	}
	u := url.URL{Scheme: "http", Host: "localhost", Path: path, RawQuery: q.Encode()}
	connected := false
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected = true }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("cannot build GET %s request: %w", path, err)
	}
	req.Header.Set("User-Agent", c.ua)
	rsp, err := c.http.Do(req)
	if err != nil {
		if !connected {
			err = c.explainDial(err)
		}
		return &ConnectionError{Socket: c.socket, Method: http.MethodGet, Path: path, Connected: connected, Written: connected, Err: withCause(ctx, err)}
	}
	defer rsp.Body.Close()
	if rsp.StatusCode != http.StatusOK {
		lr := &limitedReader{r: rsp.Body, left: MaxBody}
		var env Response
		derr := json.NewDecoder(lr).Decode(&env)
		_, err := envelope(http.MethodGet, path, rsp.StatusCode, &env, derr)
		if err == nil {
			err = &ResponseError{Method: http.MethodGet, Path: path, StatusCode: rsp.StatusCode, Err: errors.New("not an error, not a log stream")}
		}
		return err
	}
	sc := bufio.NewScanner(rsp.Body)
	sc.Buffer(make([]byte, 64<<10), MaxBody)
	for sc.Scan() {
		rec := sc.Bytes()
		i := bytes.IndexByte(rec, 0x1e)
		if i < 0 {
			continue
		}
		var l Log
		if json.Unmarshal(rec[i+1:], &l) != nil {
			continue
		}
		if err := each(l); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil && !errors.Is(err, io.EOF) {
		return &ConnectionError{Socket: c.socket, Method: http.MethodGet, Path: path, Connected: true, Written: true, Err: err}
	}
	return ctx.Err()
}
