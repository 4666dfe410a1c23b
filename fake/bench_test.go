package fake_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
)

// BenchmarkRestartAfterHistory is one restart (its request to act, and the
// in-progress listing a client reads on a conflict) on a fake that has
// made prior changes before: a long test or benchmark of an importer must
// not pay for the fake's history. Compare the ns/op of prior=0 and
// prior=10000 in one run.
func BenchmarkRestartAfterHistory(b *testing.B) {
	for _, prior := range []int{0, 10000} {
		b.Run(fmt.Sprintf("prior=%d", prior), func(b *testing.B) {
			s := fake.NewServer(b, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "svcdemo", Apps: []fake.App{
				{Name: "alpha", Daemon: "simple", Enabled: true, Active: true}}}))
			hc := keepAliveClient(s.SocketPath())
			restart := func() {
				req, _ := http.NewRequest("POST", "http://localhost/v2/apps", strings.NewReader(`{"action":"restart","names":["svcdemo.alpha"]}`))
				rsp, err := hc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				rsp.Body.Close()
				if rsp.StatusCode != 202 {
					b.Fatalf("restart: %d", rsp.StatusCode)
				}
				rsp, err = hc.Get("http://localhost/v2/changes?select=in-progress")
				if err != nil {
					b.Fatal(err)
				}
				rsp.Body.Close()
			}
			for range prior {
				restart()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				restart()
			}
		})
	}
}

// keepAliveClient is client with kept-alive connections (a benchmark's
// requests measure the fake, not the dial).
func keepAliveClient(sock string) *http.Client {
	c := client(sock)
	c.Transport.(*http.Transport).DisableKeepAlives = false
	return c
}
