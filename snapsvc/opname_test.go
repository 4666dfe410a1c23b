package snapsvc_test

import (
	"context"
	"errors"
	"testing"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// TestInvalidNamesNamed checks that an operation refused for its names
// says which names it was given, even empty ones, before any request.
func TestInvalidNamesNamed(t *testing.T) {
	c, err := snapsvc.New(snapsvc.WithSocket("/nonexistent/snapd.socket"), snapsvc.WithoutFileLock())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		names []string
		want  string
		is    error
	}{
		{[]string{""}, `snapsvc: restart "": invalid service name "": snap name "" must be 2 to 40 characters [not retryable]`, snapsvc.ErrInvalidName},
		{[]string{"k8s.kubelet", "K8S"}, `snapsvc: restart k8s.kubelet K8S: invalid service name "K8S": `, snapsvc.ErrInvalidName},
		{nil, `snapsvc: restart: `, snapsvc.ErrNoNames},
	} {
		_, err := c.Restart(context.Background(), tc.names, snapsvc.RestartOptions{})
		if !errors.Is(err, tc.is) || len(err.Error()) < len(tc.want) || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("Restart(%q): %v\nwant prefix %s", tc.names, err, tc.want)
		}
	}
}
