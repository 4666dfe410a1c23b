package snapd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// SnapctlRequest is the body of POST /v2/snapctl (client/snapctl.go
// SnapCtlPostData).
type SnapctlRequest struct {
	ContextID string   `json:"context-id"`
	Args      []string `json:"args"`
	Stdin     []byte   `json:"stdin,omitempty"`
}

// SnapctlResult is a successful snapctl run.
type SnapctlResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// ChangeID is set only by snapd >= 2.77 for commands run asynchronously.
	ChangeID string `json:"change-id,omitempty"`
}

// UnsuccessfulError is snapctl's non-zero exit: snapd answers HTTP 200 with
// "type":"error", kind "unsuccessful" and value {stdout, stderr, exit-code}
// (daemon/api_snapctl.go).
type UnsuccessfulError struct {
	Args     []string
	ExitCode int
	Stdout   string
	Stderr   string
}

func (e *UnsuccessfulError) Error() string {
	return fmt.Sprintf("snapctl %v exited with code %d: %s", e.Args, e.ExitCode, e.Stderr)
}

// RunSnapctl runs a snapctl command with the given context id (the snap's
// or the hook's cookie). It must go to the snap socket; snapd refuses it on
// the main socket with 403 login-required (daemon/access.go snapAccess).
func (c *Client) RunSnapctl(ctx context.Context, req SnapctlRequest) (*SnapctlResult, error) {
	const path = "/v2/snapctl"
	rsp, err := c.do(ctx, request{method: http.MethodPost, path: path, body: req})
	if err != nil {
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Kind == KindUnsuccessful {
			var v struct {
				Stdout   string `json:"stdout"`
				Stderr   string `json:"stderr"`
				ExitCode int    `json:"exit-code"`
			}
			if len(apiErr.Value) > 0 {
				_ = json.Unmarshal(apiErr.Value, &v)
			}
			return nil, &UnsuccessfulError{Args: req.Args, ExitCode: v.ExitCode, Stdout: v.Stdout, Stderr: v.Stderr}
		}
		return nil, err
	}
	var res SnapctlResult
	if err := decodeResult(http.MethodPost, path, rsp, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
